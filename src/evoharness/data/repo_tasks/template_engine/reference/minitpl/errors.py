class TemplateError(Exception):
    pass


class TemplateSyntaxError(TemplateError):
    def __init__(self, message, lineno):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


class UndefinedError(TemplateError):
    pass
