"""The web console: server-rendered pages the hub serves at `/`, filled and kept live by a
little vanilla JavaScript that polls the same REST API the CLI uses.

Every API call the page makes carries `Authorization: Bearer <token>` from the token box
(kept in the browser's localStorage), so the console needs exactly the rights the API does.
The pages themselves hold no data: loading one needs no token. No Node build: the script and
style sheet are plain files in `static/`.
"""

from hub.console.routes import mount_console

__all__ = ["mount_console"]
