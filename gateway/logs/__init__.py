"""The access log (nginx's formats) and the error log (nginx's format).

``access``: access log lines, buffered; ``error``: the error log; ``escape``: client text made
safe for a log line.
"""
