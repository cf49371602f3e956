"""A local HTTP server that answers JSON POSTs from a Python method, as AgentGym's servers do
(their errors too come back with status 200): the base of the tests' scripted AgentGym servers."""

from __future__ import annotations

import http.server
import json
import threading


class ScriptedJSONServer:
    """Serves `answer(path, body)` on 127.0.0.1 at a free port (`url`) from a daemon thread."""

    def __init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                data = json.dumps(server.answer(self.path, body)).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, path: str, body: dict) -> object:
        raise NotImplementedError

    def close(self) -> None:
        """Stop serving and refuse connections, as a dead server does."""
        if self.httpd.socket.fileno() != -1:
            self.httpd.shutdown()
            self.httpd.server_close()
