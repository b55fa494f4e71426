from evoharness.harness.base import MAX_PARSE_CHARS, parse_completion, split_completion

ADM = ["go to fridge 1", "open fridge 1", "take apple 1 from countertop 1", "look"]
META = ("track", "commit", "recall", "note")


def test_tagged_completion():
    p = parse_completion("<think>It may be cold.</think><action>go to fridge 1</action>", ADM)
    assert (p.kind, p.command, p.think) == ("env", "go to fridge 1", "It may be cold.")


def test_bare_and_loose_forms():
    assert parse_completion("go to fridge 1", ADM).command == "go to fridge 1"
    assert parse_completion("Thought: hmm\nAction: Go To Fridge 1.", ADM).command == "go to fridge 1"
    assert parse_completion("> open fridge 1", ADM).command == "open fridge 1"
    assert parse_completion("<think>x</think>\n`look`", ADM).command == "look"
    # an unclosed final action block (a server stripped the "</action>" stop string)
    assert parse_completion("<think>x</think><action>look", ADM).command == "look"
    # an unclosed think: everything after it is reasoning, so there is no answer
    assert parse_completion("<think>long<action>look", ADM).kind == "invalid"


def test_meta_actions():
    p = parse_completion("<action>track [apple]</action>", ADM, META)
    assert (p.kind, p.command, p.argument, p.text) == ("meta", "track", "apple", "track apple")
    assert parse_completion("<action>track</action>", ADM, META).argument == "world"
    assert parse_completion("<action>commit</action>", ADM, META).kind == "invalid"
    assert parse_completion("<action>recall where is the apple</action>", ADM, META).argument == "where is the apple"
    # a harness without meta-actions treats them as invalid
    assert parse_completion("<action>track apple</action>", ADM).kind == "invalid"


def test_garbage_never_raises():
    for junk in [
        "",
        "   ",
        "<think></think>",
        "<action></action>",
        "\x00\x01",
        "🙂" * 10,
        "a" * 20_000,
        "<action>" + "go " * 5000 + "</action>",
        "<think>" * 3000,
    ]:
        p = parse_completion(junk, ADM, META)
        assert p.kind == "invalid" and p.error
    think, action = split_completion("x" * (MAX_PARSE_CHARS * 3) + "<action>look</action>")
    assert action != "look"  # only the head is read
