"""``strom storage-node`` flags: defaults, sources and one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from strom import security as security_flags
from strom.controller import cli as controller_cli
from strom.service import flags
from strom.service.config import parse_with_sources
from strom.storage import cli

BASE = ["--node-id", "3", "--data-dir", "DATA", "--etcd", "127.0.0.1:2379"]


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return [x.replace("DATA", str(tmp_path / "d")) for x in BASE] + list(extra)


def test_defaults_and_advertised_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a wildcard --listen advertises depends on this host's name (tests/unit/
    # test_advertised.py); here the host's name is not usable.
    monkeypatch.setattr(flags, "wildcard_host", lambda host: ("127.0.0.1", "no name"))
    cfg = cli.node_config(cli.build_parser().parse_args(_args(tmp_path)))
    assert (cfg.node_id, cfg.listen, cfg.metrics_port) == (3, "0.0.0.0:9092", 9102)
    assert (cfg.advertise_host, cfg.advertise_port) == ("127.0.0.1", 9092)
    assert cfg.advertise_warning is not None and "--advertise" in cfg.advertise_warning
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
    assert cfg.advertise_warning is None


def test_environment_and_yaml_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "node.yaml"
    conf.write_text("node-id: 7\ndata-dir: /tmp/x\netcd: e:1\nlog-cleanup-interval-ms: 50\n")
    monkeypatch.setenv("STROM_LOG_CLEANUP_INTERVAL_MS", "60")
    monkeypatch.setenv("STROM_LOG_LEVEL", "DEBUG")
    args = parse_with_sources(cli.build_parser(), ["--config", str(conf)])
    cfg = cli.node_config(args)
    assert (cfg.node_id, cfg.etcd, cfg.log_cleanup_interval_ms) == (7, "e:1", 60)
    assert args.log_level == "debug"
    monkeypatch.setenv("STROM_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit) as exit_:  # the flag's choices, checked as a usage error
        parse_with_sources(cli.build_parser(), ["--config", str(conf)])
    assert exit_.value.code == 2


def _exit_code(argv: list[str]) -> int:
    """``cli.main``'s exit status, whether it returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as exit_:
        assert isinstance(exit_.code, int)
        return exit_.code


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        # Malformed flags are usage errors (exit 2), checked by the shared flag types.
        (["--node-id", "-1"], 2, "argument --node-id: must be at least 0, not -1"),
        (["--listen", "nowhere"], 2, "is not HOST:PORT"),
        (["--etcd", "bad"], 2, "is not HOST:PORT"),
        (["--session-timeout-s", "0"], 2, "argument --session-timeout-s"),
        (["--metrics-port", "70000"], 2, "out of range"),
        (["--max-connections", "-1"], 2, "argument --max-connections"),
        (["--keepalive-time-ms", "10"], 2, "argument --keepalive-time-ms: must be at least 1000"),
        (["--keepalive-timeout-ms", "x"], 2, "argument --keepalive-timeout-ms: not a whole"),
        (["--cluster", "a/b"], 2, "argument --cluster: 'a/b' must be a non-empty name"),
        # Settings the node refuses (exit 1).
        (["--listen", "127.0.0.1:0"], 1, "fixed port"),
        (["--data-dir", "/dev/null"], 1, "not a directory"),
    ],
)
def test_bad_settings_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    code: int,
    message: str,
) -> None:
    assert _exit_code(_args(tmp_path, *extra)) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("strom storage-node: error:") and message in err[0]


def test_yaml_values_are_checked_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """YAML values go through the flag types too (tests/unit/test_service_config_values.py)."""
    conf = tmp_path / "node.yaml"
    conf.write_text(f"node-id: -1\ndata-dir: {tmp_path / 'd'}\netcd: e:1\n")
    assert _exit_code(["--config", str(conf)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'node-id': must be at least 0, not -1" in err[0]


#: The storage node's flags before they came from strom.service.flags: none renamed or lost.
FLAGS = {
    "--node-id",
    "--data-dir",
    "--listen",
    "--advertise",
    "--metrics-port",
    "--etcd",
    "--cluster",
    "--rack",
    "--session-timeout-s",
    "--startup-fence-timeout-s",
    "--log-cleanup-interval-ms",
    "--checkpoint-interval-ms",
    "--replica-lag-time-max-ms",
    "--max-connections",
    "--keepalive-time-ms",
    "--keepalive-timeout-ms",
    "--max-inflight-produce-bytes",
    "--max-memory-bytes",
    "--subscribe-max-stall-ms",
    "--log-level",
    "--config",
}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings if o != "--help"}


def test_same_flags_as_before_and_shared_with_the_controller() -> None:
    storage = _options(cli.build_parser())
    controller_parser = argparse.ArgumentParser()
    controller_cli.add_arguments(controller_parser)
    controller = _options(controller_parser)
    security = set(_options(_security_parser()))
    assert set(storage) == FLAGS | security
    shared = {
        "--etcd",
        "--listen",
        "--advertise",
        "--metrics-port",
        "--cluster",
        "--max-connections",
        "--keepalive-time-ms",
        "--keepalive-timeout-ms",
        "--log-level",
        "--config",
    } | security
    for flag in shared:
        # The same definition (type, choices, help), from strom.service.flags; only the
        # port defaults differ.
        mine, theirs = storage[flag], controller[flag]
        assert (getattr(mine.type, "__qualname__", None), mine.choices, mine.help) == (
            getattr(theirs.type, "__qualname__", None),
            theirs.choices,
            theirs.help,
        ), flag
    assert storage["--listen"].default == "0.0.0.0:9092"
    assert storage["--metrics-port"].default == 9102


def _security_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    security_flags.add_arguments(parser)
    return parser


def test_every_flag_has_its_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "STROM_NODE_ID": "4",
        "STROM_DATA_DIR": str(tmp_path / "d"),
        "STROM_ETCD": "e1:2379,e2:2379",
        "STROM_LISTEN": "127.0.0.1:19092",
        "STROM_ADVERTISE": "node4.local:29092",
        "STROM_METRICS_PORT": "-1",
        "STROM_CLUSTER": "blue",
        "STROM_RACK": "r2",
        "STROM_SESSION_TIMEOUT_S": "5",
        "STROM_LOG_CLEANUP_INTERVAL_MS": "100",
        "STROM_CHECKPOINT_INTERVAL_MS": "200",
        "STROM_REPLICA_LAG_TIME_MAX_MS": "300",
        "STROM_MAX_CONNECTIONS": "12",
        "STROM_KEEPALIVE_TIME_MS": "5000",
        "STROM_KEEPALIVE_TIMEOUT_MS": "4000",
        "STROM_MAX_INFLIGHT_PRODUCE_BYTES": "4096",
        "STROM_MAX_MEMORY_BYTES": "0",
        "STROM_LOG_LEVEL": "WARNING",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = parse_with_sources(cli.build_parser(), [])
    cfg = cli.node_config(args)
    assert (cfg.node_id, cfg.data_dir, cfg.etcd, cfg.listen) == (
        4,
        tmp_path / "d",
        "e1:2379,e2:2379",
        "127.0.0.1:19092",
    )
    assert (cfg.advertise_host, cfg.advertise_port, cfg.metrics_port) == ("node4.local", 29092, -1)
    assert (cfg.cluster, cfg.rack, cfg.session_timeout_s) == ("blue", "r2", 5)
    assert (cfg.log_cleanup_interval_ms, cfg.checkpoint_interval_ms) == (100, 200)
    assert (cfg.replica_lag_time_max_ms, cfg.max_connections) == (300, 12)
    assert (cfg.max_inflight_produce_bytes, cfg.max_memory_bytes) == (4096, 0)
    assert args.log_level == "warning"
    limits = flags.server_limits(args)
    assert (limits.max_connections, limits.keepalive_time_ms, limits.keepalive_timeout_ms) == (
        12,
        5000,
        4000,
    )
    assert ("grpc.keepalive_time_ms", 5000) in limits.grpc_options()
    # A flag beats its environment variable.
    cfg = cli.node_config(parse_with_sources(cli.build_parser(), ["--node-id", "9"]))
    assert cfg.node_id == 9


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--data-dir", "x"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--node-id" in err[0]


def test_missing_config_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--config", "/nonexistent/node.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
