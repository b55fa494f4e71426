from _strict import real  # values from the code under test must be genuine
import pytest

from minitpl import Template, TemplateError, TemplateSyntaxError, UndefinedError, render


class User:
    def __init__(self, name, admin=False):
        self.name, self.admin, self._secret = name, admin, "hidden"


def test_plain_text_and_output():
    assert real(render("Hello, {{ name }}!", {"name": "World"})) == "Hello, World!"
    assert real(render("no tags at all\n")) == "no tags at all\n"


def test_kwargs_override_context():
    assert real(render("{{ a }}{{ b }}", {"a": 1, "b": 2}, b=3)) == "13"


def test_none_and_values():
    assert real(render("[{{ x }}|{{ y }}|{{ z }}]", x=None, y=0, z=[1, 2])) == "[|0|[1, 2]]"


def test_lookups():
    ctx = {"d": {"k": "v", "items": 3}, "l": ["a", "b"], "u": User("ann"), "s": "xyz"}
    assert real(render("{{ d.k }} {{ d.items }} {{ l.1 }} {{ u.name }} {{ s.0 }}", real(ctx))) == "v 3 b ann x"


def test_private_attributes_and_missing_are_undefined():
    assert real(render("[{{ u._secret }}{{ u.nope }}{{ l.5 }}{{ missing.deep.path }}]", u=real(User("a")), l=[1])) == "[]"


def test_strict_undefined():
    with pytest.raises(UndefinedError):
        Template("{{ missing }}", strict=True).render()
    with pytest.raises(UndefinedError):
        Template("{% for x in missing %}{% endfor %}", strict=True).render()
    assert real(real(Template("{{ missing | default('d') }}", strict=True)).render()) == "d"
    assert issubclass(real(UndefinedError), real(TemplateError))


def test_autoescape():
    assert real(render("{{ x }}", x="<a href=\"x\">Tom & 'Jerry'</a>")) == "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
    assert real(render("<b>{{ x | safe }}</b>", x="<i>")) == "<b><i></b>"
    assert real(real(Template("{{ x }}", autoescape=False)).render(x="<i>")) == "<i>"


def test_escape_not_twice():
    assert real(render("{{ x | escape }}", x="<&>")) == "&lt;&amp;&gt;"
    assert real(real(Template("{{ x | escape }}", autoescape=False)).render(x="<")) == "&lt;"


def test_if_elif_else():
    tpl = Template("{% if n > 10 %}big{% elif n > 5 %}medium{% elif n %}small{% else %}zero{% endif %}")
    assert [real(real(tpl).render(n=real(n))) for n in (20, 7, 1, 0)] == ["big", "medium", "small", "zero"]


def test_boolean_logic_and_comparisons():
    ctx = {"a": 1, "b": 0, "l": [1, 2], "name": "bob"}
    tpl = ("{% if a and not b %}1{% endif %}{% if b or a == 1 %}2{% endif %}{% if 2 in l %}3{% endif %}"
           "{% if 5 not in l %}4{% endif %}{% if name != 'al' and (a >= 1 or b) %}5{% endif %}"
           "{% if not (a and b) %}6{% endif %}{% if missing %}X{% endif %}")
    assert real(render(real(tpl), real(ctx))) == "123456"


def test_literals():
    assert real(render("{{ 'single' }} {{ \"double\" }} {{ 42 }} {{ true }} {{ none }}")) == "single double 42 True "


def test_for_loop_variables():
    out = render("{% for x in xs %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if loop.first %}F{% endif %}"
                 "{% if loop.last %}L{% endif %}{% if not loop.last %},{% endif %}{% endfor %}", xs=["a", "b", "c"])
    assert real(out) == "1/3:aF,2/3:b,3/3:cL"
    assert real(render("{% for x in xs %}{{ loop.index0 }}{% endfor %}", xs="abc")) == "012"


def test_for_else_and_dict_iteration():
    assert real(render("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", xs=[])) == "empty"
    assert real(render("{% for x in missing %}{{ x }}{% else %}none{% endfor %}")) == "none"
    assert real(render("{% for k in d %}{{ k }}{% endfor %}", d={"a": 1, "b": 2})) == "ab"


def test_for_unpacking_and_items():
    out = render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", d={"a": 1, "b": 2})
    assert real(out) == "a=1;b=2;"
    assert real(render("{% for a, b in pairs %}{{ a }}{{ b }}{% endfor %}", pairs=[(1, 2), (3, 4)])) == "1234"


def test_nested_loops_shadow_loop():
    out = render("{% for r in rows %}{% for c in r %}{{ loop.index }}{% endfor %}-{{ loop.index }} {% endfor %}",
                 rows=[[1, 2], [3]])
    assert real(out) == "12-1 1-2 "


def test_loop_scope_does_not_leak():
    assert real(render("{% for x in xs %}{% endfor %}[{{ x }}][{{ loop }}]", xs=[1])) == "[][]"
    assert real(render("{{ x }}{% for x in xs %}{{ x }}{% endfor %}{{ x }}", x="o", xs=[1, 2])) == "o12o"


def test_set():
    assert real(render("{% set n = items | length %}{{ n }} items")) == "0 items"
    assert real(render("{% set n = xs | length %}{% for x in xs %}{% set n = 99 %}{% endfor %}{{ n }}", xs=[1, 2])) == "2"


def test_context_not_modified():
    ctx = {"xs": [3, 1, 2], "a": 1}
    assert real(render("{% set a = 5 %}{% for x in xs | sort %}{{ x }}{% endfor %}", ctx)) == "123"
    assert real(ctx) == {"xs": [3, 1, 2], "a": 1}


@pytest.mark.parametrize("tpl,expected", [
    ("{{ s | upper }}", "HELLO WORLD"), ("{{ s | title }}", "Hello World"), ("{{ '  x  ' | trim }}", "x"),
    ("{{ xs | length }}", "3"), ("{{ xs | first }}{{ xs | last }}", "32"), ("{{ xs | reverse | join(',') }}", "2,1,3"),
    ("{{ xs | sort | join }}", "123"), ("{{ s | reverse }}", "dlrow olleh"), ("{{ missing | length }}", "0"),
    ("{{ none | default('n/a') }}", "n/a"), ("{{ 0 | default('zero') }}", "0"), ("{{ s | upper | lower }}", "hello world"),
    ("{{ xs | join(s | upper) }}", "3HELLO WORLD1HELLO WORLD2"),
])
def test_filters(tpl, expected):
    assert real(render(tpl, s="hello world", xs=[3, 1, 2])) == expected


def test_whitespace_control():
    tpl = "<ul>\n  {%- for x in xs %}\n  <li>{{ x }}</li>\n  {%- endfor %}\n</ul>"
    assert real(render(real(tpl), xs=[1, 2])) == "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>"
    assert real(render("a   {{- x -}}   b", x="X")) == "aXb"
    assert real(render("{% if true -%}\n\n  yes  \n{%- endif %}")) == "yes"


def test_comments():
    assert real(render("a{# a comment with {{ tags }} and {% if %} #}b")) == "ab"


def test_template_reusable():
    t = Template("{{ n }}")
    assert [real(real(t).render(n=real(i))) for i in range(3)] == ["0", "1", "2"]


@pytest.mark.parametrize("source,lineno", [
    ("line1\n{{ x ", 2), ("{% if x %}\n\nopen", 1), ("a\n{% endif %}", 2), ("{% for x in y %}{% endif %}", 1),
    ("\n\n{% frobnicate %}", 3), ("{{ x | nosuchfilter }}", 1), ("{{ }}", 1), ("x\n{{ a b }}", 2),
    ("{% for in y %}{% endfor %}", 1), ("{% else %}", 1), ("{% if x %}{% else %}{% elif y %}{% endif %}", 1),
    ("{{ (a }}", 1), ("\n{% set = 3 %}", 2), ("{{ a == }}", 1), ("{% if %}{% endif %}", 1),
])
def test_syntax_errors(source, lineno):
    with pytest.raises(TemplateSyntaxError) as info:
        Template(source)
    assert real(real(real(info).value).lineno) == lineno
    assert isinstance(real(real(info).value), real(TemplateError))


def test_no_eval():
    assert real(render("{{ __import__ }}")) == ""
    with pytest.raises(TemplateSyntaxError):
        Template("{{ x[0] }}")
