"""A Prefect server started on another port serves a UI that asks that port's API: Prefect's UI
reads PREFECT_UI_API_URL, which defaults to port 4200 whatever `--port` says (seen in a browser:
empty pages and "Oops. Something went wrong")."""

from __future__ import annotations

from ops import services


def started_env(monkeypatch, tmp_path, port: int) -> dict:
    spawned = {}

    def spawn(name, cmd, log, env=None):
        spawned.update(cmd=cmd, env=env)

    monkeypatch.setattr(services, "_spawn", spawn)
    monkeypatch.setattr(services, "wait_until_up", lambda service, url: service)
    services.start_prefect_server(tmp_path, port)
    assert spawned["cmd"][-2:] == ["--port", str(port)]
    return spawned["env"]


def test_the_ui_asks_the_port_the_server_listens_on(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_UI_API_URL", raising=False)
    env = started_env(monkeypatch, tmp_path, 4300)
    assert env["PREFECT_UI_API_URL"] == "http://127.0.0.1:4300/api"


def test_a_ui_api_url_the_user_set_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFECT_UI_API_URL", "https://flows.example.org/api")
    env = started_env(monkeypatch, tmp_path, 4300)
    assert env["PREFECT_UI_API_URL"] == "https://flows.example.org/api"
