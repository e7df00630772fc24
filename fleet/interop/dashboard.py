"""``fleet dashboard``: optuna-dashboard's WSGI app over :class:`~fleet.interop.optuna_storage.FleetStorage`, served
by a threaded ``wsgiref`` server (optuna-dashboard's own ``run_server`` serves one request at a time)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from fleet.store import Store


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Requests are not logged: a page's dozens of API calls would drown what matters."""


def serve(
    store: Store, host: str, port: int, campaigns: Sequence[str] = (), *, announce: Callable[[str], None] = print
) -> None:
    """Serve the dashboard until interrupted.

    Parameters
    ----------
    store:
        Fleet's store, read on every request.
    host, port:
        Where to listen; port 0 takes any free port.
    campaigns:
        Names or ids of the campaigns to show; default all.
    announce:
        Called with the dashboard's URL once it listens.
    """
    from optuna_dashboard import wsgi

    from fleet.interop.optuna_storage import FleetStorage

    app = wsgi(FleetStorage(store, campaigns))
    server = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    shown = f"[{host}]" if ":" in host else host
    announce(f"http://{shown}:{server.server_port}/dashboard/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
