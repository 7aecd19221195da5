"""``--config FILE`` values of every service go through the flag's checks, and a file that
cannot be read or parsed is one line: found from outside, where a YAML number, boolean or
list skipped the checks (a traceback later, or a value taken as it stood) and a directory,
a non-UTF-8 file or bad YAML printed a traceback or several lines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from strom.controller import cli as controller_cli
from strom.coordinator import cli as coordinator_cli
from strom.service.config import parse_with_sources
from strom.storage import cli as storage_cli

#: Each service's main() and the settings it needs besides the one under test.
SERVICES: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "storage-node": (storage_cli.main, "node-id: 1\ndata-dir: DATA\netcd: e:1\n"),
    "controller": (controller_cli.main, "etcd: e:1\n"),
    "coordinator": (coordinator_cli.main, "etcd: e:1\n"),
}


def _exit(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:
        assert isinstance(exit_.code, int)
        return exit_.code


def _one_line(capsys: pytest.CaptureFixture[str], service: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"strom {service}: error: config file "), err[0]
    return err[0]


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("etcd: 5", "'etcd': etcd endpoint '5' is not HOST:PORT"),
        ("metrics-port: [1, 2]", "'metrics-port': expected one value, not a list"),
        ("metrics-port: {a: 1}", "'metrics-port': expected one value, not a mapping"),
        ("metrics-port: abc", "'metrics-port': not a port number"),
        ("listen: 5", "'listen': address '5' is not HOST:PORT"),
        ("max-connections: true", "'max-connections': expected a whole number, not the boolean"),
        ("max-connections: 1.5", "'max-connections': not a whole number: '1.5'"),
        ("log-level: loud", "'log-level': 'loud' is not one of debug"),
        ("acls: maybe", "'acls': not a boolean"),
        ("cluster:", "'cluster': no value given"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting_and_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    service: str,
    setting: str,
    fragment: str,
) -> None:
    main, base = SERVICES[service]
    conf = tmp_path / "c.yaml"
    conf.write_text(base.replace("DATA", str(tmp_path / "d")) + setting + "\n")
    assert _exit(main, ["--config", str(conf)]) == 2
    line = _one_line(capsys, service)
    assert f"config file {conf}: invalid value for {fragment}" in line, line


def test_node_id_must_be_a_whole_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text(f"node-id: 1.5\ndata-dir: {tmp_path / 'd'}\netcd: e:1\n")
    assert _exit(storage_cli.main, ["--config", str(conf)]) == 2
    assert "'node-id': not a whole number: '1.5'" in _one_line(capsys, "storage-node")


def test_yaml_scalars_read_as_the_same_text_on_the_command_line(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "node-id: 7\ndata-dir: /x\netcd: e:1\ncluster: 42\nrack: 2024-01-01\n"
        "startup-fence-timeout-s: 5\nacls: true\nsuper-users: ['User:a', 'User:b']\n"
    )
    args = parse_with_sources(storage_cli.build_parser(), ["--config", str(conf)])
    assert (args.node_id, args.cluster, args.rack) == (7, "42", "2024-01-01")
    assert args.startup_fence_timeout_s == 5.0 and isinstance(args.startup_fence_timeout_s, float)
    assert args.acls is True and args.super_users == ["User:a", "User:b"]
    conf.write_text("node-id: 7\ndata-dir: /x\netcd: e:1\nacls: false\n")
    assert parse_with_sources(storage_cli.build_parser(), ["--config", str(conf)]).acls is False


def test_a_boolean_flag_from_the_environment_is_read_as_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """STROM_ACLS=false was the string 'false', which is true."""
    monkeypatch.setenv("STROM_ACLS", "false")
    parser = storage_cli.build_parser()
    args = parse_with_sources(parser, ["--node-id", "1", "--data-dir", "/x", "--etcd", "e:1"])
    assert args.acls is False
    monkeypatch.setenv("STROM_ACLS", "")  # set empty: off, as before
    assert (
        parse_with_sources(parser, ["--node-id", "1", "--data-dir", "/x", "--etcd", "e:1"]).acls
        is False
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_directory_is_one_line(
    service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main, _ = SERVICES[service]
    code = _exit(main, ["--config", str(tmp_path)])
    assert code == 2
    assert f"config file {tmp_path} cannot be read: Is a directory" in _one_line(capsys, service)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_file_not_in_utf8_is_one_line(
    service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main, _ = SERVICES[service]
    conf = tmp_path / "c.yaml"
    conf.write_bytes(b"\xff\xfe")
    assert _exit(main, ["--config", str(conf)]) == 2
    line = _one_line(capsys, service)
    assert f"config file {conf} cannot be read: 'utf-8' codec can't decode" in line, line


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_bad_yaml_is_one_line_with_its_place(
    service: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main, _ = SERVICES[service]
    conf = tmp_path / "c.yaml"
    conf.write_text("etcd: e:1\nlisten: a\n  b: [\n")
    assert _exit(main, ["--config", str(conf)]) == 2
    line = _one_line(capsys, service)
    assert f"config file {conf}:3:4: is not valid YAML: mapping values are not allowed" in line
