"""Text a client chose (its process name, call sites, kernel names, the messages built from
them), made safe to write into the daemon's log: nothing it contains can end a log line
and start a forged one, or drive the terminal the log is read in."""


def escaped(text: object) -> str:
    """`text` with every unprintable character (newline, carriage return, escape, other
    control and separator characters) written as its Python escape (\\n, \\x1b, \\u2028);
    printable text is returned unchanged."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
