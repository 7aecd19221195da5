"""``strom storage-node`` flags: defaults, sources and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.storage import cli

BASE = ["--node-id", "3", "--data-dir", "DATA", "--etcd", "127.0.0.1:2379"]


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return [x.replace("DATA", str(tmp_path / "d")) for x in BASE] + list(extra)


def test_defaults_and_advertised_address(tmp_path: Path) -> None:
    cfg = cli.node_config(cli.build_parser().parse_args(_args(tmp_path)))
    assert (cfg.node_id, cfg.listen, cfg.metrics_port) == (3, "0.0.0.0:9092", 9102)
    assert (cfg.advertise_host, cfg.advertise_port) == ("127.0.0.1", 9092)
    assert (cfg.cluster, cfg.session_timeout_s, cfg.log_cleanup_interval_ms) == ("strom", 2, 30000)
    cfg = cli.node_config(
        cli.build_parser().parse_args(_args(tmp_path, "--listen", "10.0.0.5:9500", "--rack", "r1"))
    )
    assert (cfg.advertise_host, cfg.advertise_port, cfg.rack) == ("10.0.0.5", 9500, "r1")
    cfg = cli.node_config(
        cli.build_parser().parse_args(_args(tmp_path, "--advertise", "node3.local:19092"))
    )
    assert (cfg.listen, cfg.advertise_host, cfg.advertise_port) == (
        "0.0.0.0:9092",
        "node3.local",
        19092,
    )


def test_environment_and_yaml_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "node.yaml"
    conf.write_text("node-id: 7\ndata-dir: /tmp/x\netcd: e:1\nlog-cleanup-interval-ms: 50\n")
    monkeypatch.setenv("STROM_LOG_CLEANUP_INTERVAL_MS", "60")
    monkeypatch.setenv("STROM_LOG_LEVEL", "DEBUG")
    args = cli.parse_with_sources(cli.build_parser(), ["--config", str(conf)])
    cfg = cli.node_config(args)
    assert (cfg.node_id, cfg.etcd, cfg.log_cleanup_interval_ms) == (7, "e:1", 60)
    assert args.log_level == "debug"
    monkeypatch.setenv("STROM_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="--log-level"):
        cli.node_config(cli.parse_with_sources(cli.build_parser(), ["--config", str(conf)]))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--node-id", "-1"], "--node-id must be >= 0"),
        (["--listen", "nowhere"], "is not HOST:PORT"),
        (["--etcd", "bad"], "is not HOST:PORT"),
        (["--session-timeout-s", "0"], "--session-timeout-s"),
        (["--listen", "127.0.0.1:0"], "fixed port"),
        (["--data-dir", "/dev/null"], "not a directory"),
    ],
)
def test_bad_settings_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert cli.main(_args(tmp_path, *extra)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("strom storage-node: error:") and message in err[0]


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--data-dir", "x"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--node-id" in err[0]


def test_missing_config_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--config", "/nonexistent/node.yaml"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
