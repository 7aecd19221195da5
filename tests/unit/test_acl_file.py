"""ACL files (``strom acls apply``, the chart's ``acls.bootstrap``): what they turn into,
and mistakes refused whole, naming the entry and the field."""

from __future__ import annotations

import pytest

from strom.api import metadata_pb2 as md
from strom.security.acl import CLUSTER, Acl
from strom.security.acl_file import AclFileError, parse_acl_file


def test_entries_become_one_binding_per_operation() -> None:
    text = """
- principal: User:CN=orders-service
  allow: [write, describe]
  topic: orders
- principal: User:*
  deny: all
  topic-prefix: secret-
- principal: User:CN=billing
  allow: [READ]
  group-prefix: billing-
- principal: User:CN=ops
  allow: [alter, cluster_action]
  cluster: true
- principal: User:CN=etl
  allow: [write]
  transactional-id: etl-*
"""
    got = [str(Acl.from_proto(b)) for b in parse_acl_file(text)]
    assert got == [
        "ALLOW User:CN=orders-service WRITE on TOPIC 'orders'",
        "ALLOW User:CN=orders-service DESCRIBE on TOPIC 'orders'",
        "DENY User:* ALL on TOPIC prefix 'secret-'",
        "ALLOW User:CN=billing READ on GROUP prefix 'billing-'",
        f"ALLOW User:CN=ops ALTER on CLUSTER '{CLUSTER}'",
        f"ALLOW User:CN=ops CLUSTER_ACTION on CLUSTER '{CLUSTER}'",
        "ALLOW User:CN=etl WRITE on TRANSACTIONAL_ID 'etl-*'",
    ]
    b = parse_acl_file(text)[2]
    assert b.permission == md.ACL_PERMISSION_DENY and b.pattern_type == md.PATTERN_TYPE_PREFIXED


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "[]"])
def test_an_empty_file_is_no_entries(text: str) -> None:
    assert parse_acl_file(text) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [", "not YAML"),
        ("principal: User:x", "a list of entries"),
        ("- User:x", "entry 1: expected a mapping"),
        ("- {allow: [read], topic: t}", "entry 1: 'principal'"),
        ("- {principal: bob, allow: [read], topic: t}", "entry 1: principal must be 'User:"),
        ("- {principal: User:a, topic: t}", "exactly one of 'allow' or 'deny'"),
        ("- {principal: User:a, allow: [read], deny: [write], topic: t}", "exactly one of"),
        ("- {principal: User:a, allow: [], topic: t}", "must list operations"),
        ("- {principal: User:a, allow: [raed], topic: t}", "unknown operation 'raed'"),
        ("- {principal: User:a, allow: [read]}", "exactly one resource"),
        ("- {principal: User:a, allow: [read], topic: t, group: g}", "exactly one resource"),
        ("- {principal: User:a, allow: [read], topic: ''}", "'topic' must be a non-empty"),
        ("- {principal: User:a, allow: [read], group: ' '}", "'group' must be a non-empty"),
        ("- {principal: 'User: ', allow: [read], topic: t}", "entry 1: principal must be"),
        ("- {principal: User:a, allow: [read], cluster: yes-please}", "'cluster' must be true"),
        ("- {principal: User:a, allow: [read], topic-prefix: '*'}", "PREFIXED pattern"),
        ("- {principal: User:a, allow: [read], topc: t}", "unknown key(s) topc"),
        (
            "- {principal: User:a, allow: [read], topic: t}\n- {principal: User:b, topic: t}",
            "entry 2:",
        ),
    ],
)
def test_mistakes_are_refused_naming_the_entry(text: str, message: str) -> None:
    with pytest.raises(AclFileError) as err:
        parse_acl_file(text)
    assert message in str(err.value)


def _subject_principal() -> str:
    """The principal the services derive from a certificate of CN "Smith, John", O Acme."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from strom.security.principal import user

    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme"),
            x509.NameAttribute(NameOID.COMMON_NAME, "Smith, John"),
        ]
    )
    return user(name.rfc4514_string())


def test_a_certificate_principal_typed_with_spaces_matches_its_certificate() -> None:
    """Found from outside: `acls add`/`acls apply` kept 'User:CN=Smith\\, John, O=Acme' as
    typed, which never matched the derived 'User:CN=Smith\\, John,O=Acme' (--super-users
    normalised it already): both write it as the services derive it now."""
    from strom.cli.acls import _principal
    from strom.cli.main import build_parser
    from strom.security.config import parse_super_users

    derived = _subject_principal()
    assert derived == r"User:CN=Smith\, John,O=Acme"
    typed = r"User:CN=Smith\, John, O=Acme"
    (b,) = parse_acl_file(f"- principal: '{typed}'\n  allow: [read]\n  topic: orders\n")
    assert b.principal == derived
    assert _principal(typed) == derived
    assert parse_super_users(typed + ";") == {derived}
    args = build_parser().parse_args(
        ["acls", "add", "--allow", typed, "--operation", "read", "--topic", "t"]
    )
    assert args.allow == derived
    # Anything that is not a certificate's subject stays as it is.
    for kept in ("User:alice", "User:*", "User:a, b", r"User:CN=a\ ,O=b"):
        assert _principal(kept) == kept
