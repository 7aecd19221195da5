"""``strom acls apply`` and ``strom dev cert`` mistakes: one line naming the problem, exit 1,
no traceback, and nothing sent (no cluster runs here)."""

from __future__ import annotations

import os
import stat
from argparse import Namespace
from pathlib import Path

import pytest

from strom.cli.main import main
from strom.devcluster.certs import CertificateAuthority
from strom.devcluster.cluster import DEV_CA
from strom.service.flags import check_services_authenticate


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_acls_apply_refuses_a_bad_file_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "acls.yaml"
    f.write_text("- {principal: User:a, allow: [read], topic: t}\n- {principal: b, deny: [all]}\n")
    # An address nothing listens on: the file is refused before any connection is tried.
    code, _, err = run(capsys, "acls", "apply", str(f), "--bootstrap", "127.0.0.1:1")
    assert code == 1
    assert f"{f}: entry 2: principal must be 'User:<name>'" in err
    assert "Traceback" not in err
    code, _, err = run(capsys, "acls", "apply", str(tmp_path / "missing.yaml"), "-b", "h:1")
    assert code == 1 and "cannot read" in err and "missing.yaml" in err


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        # Found from outside: the decoder's message, without the file's name.
        (b"\xff\xfe", "cannot read {f}: not UTF-8"),
        # Found from outside: PyYAML's message, over several lines.
        (b"- {principal: User:a\n  allow: [read]: x\n", "{f}: not YAML at line 2, column"),
    ],
)
def test_acls_apply_names_a_file_it_cannot_read_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, fragment: str
) -> None:
    f = tmp_path / "acls.yaml"
    f.write_bytes(content)
    code, _, err = run(capsys, "acls", "apply", str(f), "--bootstrap", "127.0.0.1:1")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("strom acls: error: ") and fragment.format(f=f) in lines[0]
    code, _, err = run(capsys, "acls", "apply", str(tmp_path), "--bootstrap", "127.0.0.1:1")
    assert code == 1 and f"cannot read {tmp_path}: Is a directory" in err


def test_dev_cert_needs_the_dev_ca_and_a_plain_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "dev", "cert", "alice", "--dir", str(tmp_path))
    assert code == 1 and "strom dev up --tls" in err
    CertificateAuthority(tmp_path / "tls", DEV_CA)
    code, _, err = run(capsys, "dev", "cert", "al/ice", "--dir", str(tmp_path))
    assert code == 1 and "certificate name 'al/ice'" in err
    code, out, _ = run(capsys, "dev", "cert", "alice", "--dir", str(tmp_path))
    assert code == 0
    assert "principal  User:CN=alice" in out
    assert f"export STROM_SSL_CERTFILE={tmp_path / 'tls' / 'alice.crt'}" in out
    assert (tmp_path / "tls" / "alice.key").exists()


@pytest.mark.parametrize("service", ["controller", "coordinator", "storage-node"])
def test_a_service_names_a_bad_certificate_or_key_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], service: str
) -> None:
    """gRPC itself only says "Failed to bind to address" for an unusable key (read as a taken
    port); the service checks its TLS files first and names the flag and the file."""
    ca = CertificateAuthority(tmp_path / "ca")
    mine, other = ca.issue("strom"), ca.issue("other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem file\n")
    base = [service, "--etcd", "127.0.0.1:1"]
    if service == "storage-node":
        base += ["--node-id", "1", "--data-dir", str(tmp_path / "data")]

    def refused(*flags: str) -> str:
        code, _, err = run(capsys, *base, *flags)
        assert code == 2 and "Traceback" not in err
        return err

    tls = ["--tls-cert", str(mine.cert)]
    err = refused(*tls, "--tls-key", str(garbage))
    assert f"--tls-key {garbage}: no PEM private key in it" in err
    err = refused(*tls, "--tls-key", str(other.key))
    assert f"--tls-key {other.key} is not the key of --tls-cert {mine.cert}" in err
    err = refused("--tls-cert", str(garbage), "--tls-key", str(mine.key))
    assert f"--tls-cert {garbage}: no PEM certificate in it" in err
    err = refused(*tls, "--tls-key", str(mine.key), "--tls-ca", str(garbage))
    assert f"--tls-ca {garbage}: no PEM certificate in it" in err
    # Every client would refuse an expired certificate: named at start, not served.
    expired = ca.issue("strom", expired=True)
    err = refused("--tls-cert", str(expired.cert), "--tls-key", str(expired.key))
    assert f"--tls-cert {expired.cert}: the certificate expired on" in err
    err = refused(
        "--etcd-ca", str(ca.ca_file), "--etcd-cert", str(mine.cert), "--etcd-key", str(garbage)
    )
    assert f"--etcd-key {garbage}: no PEM private key in it" in err


@pytest.mark.parametrize("service", ["controller", "coordinator", "storage-node"])
def test_a_service_refuses_checks_its_peers_could_not_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], service: str
) -> None:
    """--acls or --auth-tokens without mTLS or a service token: the services would call each
    other as User:ANONYMOUS and be denied (or refused as unauthenticated) every internal
    call; refused at start-up, one line, exit 2 (found from outside: such a cluster started
    and never worked). With mTLS or a token the flags pass the check."""
    ca = CertificateAuthority(tmp_path / "ca")
    mine = ca.issue("strom")
    base = [service, "--etcd", "127.0.0.1:1"]
    if service == "storage-node":
        base += ["--node-id", "1", "--data-dir", str(tmp_path / "data")]
    acls = ["--acls", "--super-users", "User:CN=strom"]
    tls = ["--tls-cert", str(mine.cert), "--tls-key", str(mine.key), "--tls-ca", str(ca.ca_file)]
    tokens = tmp_path / "tokens"
    tokens.write_text("t1 strom\n")
    for flags in (acls, [*acls, *tls], [*acls, *tls, "--tls-client-auth", "none"]):
        code, _, err = run(capsys, *base, *flags, "--auth-tokens", str(tokens))
        assert code == 2, err
        assert "--acls needs the services to authenticate to each other" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    for flags in ([*tls, "--tls-client-auth", "none"], []):
        code, _, err = run(capsys, *base, *flags, "--auth-tokens", str(tokens))
        assert code == 2, err
        assert "--auth-tokens makes every caller authenticate" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    for ok in (
        Namespace(acls=True, tls_client_auth="required"),
        Namespace(acls=True, client_token_file="service.token", auth_tokens="tokens"),
        Namespace(auth_tokens="tokens", tls_client_auth="required"),
        Namespace(acls=False, auth_tokens=None),
        Namespace(tls_cert="c", tls_key="k", tls_client_auth="none"),  # TLS only: anonymous
    ):
        check_services_authenticate(ok)


@pytest.mark.parametrize(
    "argv",
    [
        ["remove", "--principal", "User:alice", "--topic", ""],
        ["remove", "--operation", "write", "--group-prefix", ""],
        ["list", "--transactional-id", ""],
        ["add", "--allow", "User:alice", "--operation", "read", "--topic", ""],
        ["add", "--allow", "", "--operation", "read", "--topic", "t"],
        ["remove", "--principal", "", "--topic", "t"],
        # Blank is empty too (found from outside: these were taken).
        ["add", "--allow", "User: ", "--operation", "read", "--topic", "t"],
        ["add", "--deny", "User:", "--operation", "read", "--topic", "t"],
        ["list", "--principal", "  "],
        ["remove", "--topic", " "],
        ["add", "--allow", "User:alice", "--operation", "read", "--group-prefix", "\t"],
    ],
)
def test_acls_refuse_an_empty_name_before_connecting(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty resource name or principal counted as "none given": `acls remove --topic ''`
    removed the principal's entries on every resource, `acls add --topic ''` failed with a
    traceback (found from outside). Refused as a usage error, nothing sent."""
    with pytest.raises(SystemExit) as exit_:
        main(["acls", *argv, "--bootstrap", "127.0.0.1:1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "must not be empty" in err and "Traceback" not in err


def test_an_acl_filter_takes_a_given_resource_flag_even_if_empty() -> None:
    """The filter of `acls list/remove` names the resource of any flag given: an empty name
    that got past the parser is an error, never a filter without a resource."""
    from strom.cli.acls import _resource

    base = dict(topic=None, topic_prefix=None, group=None, group_prefix=None, cluster=False)
    with pytest.raises(ValueError, match="--group-prefix must not be empty"):
        _resource(Namespace(**{**base, "group_prefix": ""}, transactional_id=None))
    assert _resource(Namespace(**base, transactional_id=None)) is None


def test_dev_keys_are_readable_by_their_owner_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dev CA's key and every key `strom dev cert` issues were written 0644 (the umask),
    so any local user could mint an admin certificate (found from outside). They are created
    0600 whatever the umask, and a key issued again over an old 0644 file is 0600 too."""
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "alice.key").write_text("an old key\n")
    (tls / "alice.key").chmod(0o644)
    old = os.umask(0)  # the widest umask: the mode must not come from it
    try:
        ca = CertificateAuthority(tls, DEV_CA)
        code, _, _ = run(capsys, "dev", "cert", "alice", "--dir", str(tmp_path))
    finally:
        os.umask(old)
    assert code == 0
    for key in (ca.pem.key, tls / "alice.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert b"PRIVATE KEY" in (tls / "alice.key").read_bytes()
    assert sorted(p.name for p in tls.iterdir()) == sorted(
        [f"{DEV_CA}.crt", f"{DEV_CA}.key", "alice.crt", "alice.key"]
    )
