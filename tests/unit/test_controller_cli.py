"""``strom controller`` flags: defaults, sources (flags > STROM_* env > YAML) and errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from strom.controller import cli
from strom.service import flags
from strom.service.config import parse_with_sources


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=cli.PROG)
    cli.add_arguments(parser)
    return parse_with_sources(parser, argv)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a wildcard --listen advertises depends on this host's name (tests/unit/
    # test_advertised.py); here the host's name is not usable.
    monkeypatch.setattr(flags, "wildcard_host", lambda host: ("127.0.0.1", "no name"))
    args = _parse(["--etcd", "127.0.0.1:2379"])
    assert args.listen == "0.0.0.0:9093"
    assert args.metrics_port == 9103
    assert args.cluster == "strom"
    assert args.controller_id is None
    assert args.session_timeout_s == 2
    assert args.log_level == "info"

    def advertised(listen: str, advertise: str | None) -> tuple[str, int]:
        address = flags.advertised_address(listen, advertise)
        return address.host, address.port

    assert advertised(args.listen, args.advertise) == ("127.0.0.1", 9093)
    assert advertised("10.0.0.5:7000", None) == ("10.0.0.5", 7000)
    assert advertised("0.0.0.0:7000", "ctl-0.strom:7000") == ("ctl-0.strom", 7000)


def test_sources_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("etcd: e1:1\ncluster: from-yaml\nmetrics-port: 1111\ncontroller-id: 7\n")
    monkeypatch.setenv("STROM_CLUSTER", "from-env")
    args = _parse(["--config", str(cfg), "--controller-id", "9"])
    assert args.etcd == "e1:1"  # YAML satisfies the required flag
    assert args.cluster == "from-env"  # env beats YAML
    assert args.metrics_port == 1111
    assert args.controller_id == 9  # flag beats YAML


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "--etcd"),
        (["--etcd", "nohost"], "not HOST:PORT"),
        (["--etcd", "h:1", "--listen", "nope"], "not HOST:PORT"),
        (["--etcd", "h:1", "--session-timeout-s", "1"], "at least 2"),
        (["--etcd", "h:1", "--controller-id", "-3"], "at least 0"),
        (["--etcd", "h:1", "--metrics-port", "70000"], "out of range"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_missing_config_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--config", "/nonexistent/strom.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("strom controller: error:") and "does not exist" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("given", ["warn", "WARN", "Warning", " warning "])
def test_warn_is_the_warning_level_in_any_case(
    given: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--log-level warn`` (as Kafka and Python users type it) was refused; any case of it
    is warning now, from a flag, ``STROM_LOG_LEVEL`` and the YAML file alike."""
    assert _parse(["--etcd", "e:1", "--log-level", given]).log_level == "warning"
    monkeypatch.setenv("STROM_LOG_LEVEL", given)
    assert _parse(["--etcd", "e:1"]).log_level == "warning"
    monkeypatch.delenv("STROM_LOG_LEVEL")
    conf = tmp_path / "c.yaml"
    conf.write_text(f"log-level: {given.strip()}\n")
    assert _parse(["--etcd", "e:1", "--config", str(conf)]).log_level == "warning"


def test_an_unknown_log_level_is_still_refused_naming_the_levels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _parse(["--etcd", "e:1", "--log-level", "loud"])
    assert "'loud'" in capsys.readouterr().err
