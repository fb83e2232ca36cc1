"""The token the measured env's driver sends to a Ray cluster, and what it says when refused (no Ray needed)."""

from __future__ import annotations

from envs.real.ray_access import refused_message, sends_token, token_source, unasked_token_message


def test_token_sources_in_rays_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    token = tmp_path / "tok"
    token.write_text("t")
    assert token_source({}) is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t")
    assert token_source({}) == str(tmp_path / ".ray" / "auth_token")
    assert token_source({"RAY_AUTH_TOKEN_PATH": str(token)}) == str(token)
    assert token_source({"RAY_AUTH_TOKEN_PATH": str(token), "RAY_AUTH_TOKEN": "x"}) == "RAY_AUTH_TOKEN"


def test_the_driver_sends_a_token_only_when_ray_auth_mode_is_unset_and_the_cluster_asks():
    assert sends_token({}, has_token=True, cluster_asks=True)
    assert not sends_token({}, has_token=False, cluster_asks=True)
    assert not sends_token({}, has_token=True, cluster_asks=False)  # a token left by a local run, say
    assert not sends_token({"RAY_AUTH_MODE": "disabled"}, has_token=True, cluster_asks=True)  # the user's choice
    assert not sends_token({"RAY_AUTH_MODE": "token"}, has_token=True, cluster_asks=True)  # already on


def test_only_a_driver_set_to_token_mode_cannot_join_a_cluster_without_authentication():
    assert unasked_token_message({}) is None and unasked_token_message({"RAY_AUTH_MODE": "disabled"}) is None
    msg = unasked_token_message({"RAY_AUTH_MODE": "token"})
    assert "\n" not in msg and "does not use token authentication" in msg and "unset RAY_AUTH_MODE" in msg


def test_refusals_say_where_the_token_came_from_and_where_it_must_go(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    token = tmp_path / "tok"
    token.write_text("t")
    wrong = refused_message({"RAY_AUTH_TOKEN_PATH": str(token)})
    none = refused_message({})
    disabled = refused_message({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"})
    assert wrong.startswith(f"the Ray cluster refused the authentication token from {token} ")
    assert "this machine has no token" in none
    assert "RAY_AUTH_MODE=disabled here" in disabled
    for msg in (wrong, none, disabled):
        assert "\n" not in msg and "~/.ray/auth_token" in msg and "RAY_AUTH_TOKEN" in msg


def test_native_stderr_is_silenced_for_the_block_only(capfd):
    import os

    from envs.real.ray_access import native_stderr_silenced

    with native_stderr_silenced():
        os.write(2, b"native noise\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
