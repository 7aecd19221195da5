"""docs/grpc-clients.md stays true: its Node.js example is the file the integration tests run
(tests/node/example.js), and every grpcurl request body parses as the message its RPC takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import json_format

from strom.api import records_pb2

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "grpc-clients.md").read_text()


def test_the_node_code_in_the_docs_is_the_tested_code() -> None:
    """The complete example is tests/node/example.js; the leader-routing fragment is a
    function of tests/node/lib/strom.js, word for word; the TLS fragment is the core of
    tests/node/tls_example.js."""
    blocks = re.findall(r"```js\n(.*?)```", DOC, flags=re.S)
    assert len(blocks) == 3
    assert blocks[0] == (ROOT / "tests" / "node" / "example.js").read_text()
    assert "function splitByLeader" in blocks[1]
    assert blocks[1] in (ROOT / "tests" / "node" / "lib" / "strom.js").read_text()
    # The TLS fragment is the core of tests/node/tls_example.js (which a test runs against a
    # --tls cluster): the same credentials call, key before certificate, the same options.
    tls = (ROOT / "tests" / "node" / "tls_example.js").read_text()
    assert "grpc.credentials.createSsl(" in blocks[2] and "grpc.credentials.createSsl(" in tls
    assert blocks[2].index("alice.key'") < blocks[2].index("alice.crt'")
    options = blocks[2][blocks[2].index("new strom.RecordService(") :].split("\n", 1)[1]
    assert options in tls


GRPCURL = re.findall(
    r"-d '(\{.*?\})'\s*\\?\s*\n?\s*\S+ strom\.v1\.RecordService/(\w+)", DOC, flags=re.S
)


@pytest.mark.parametrize(("body", "method"), GRPCURL)
def test_grpcurl_bodies_parse_as_their_requests(body: str, method: str) -> None:
    cls = {
        "ProduceRecords": records_pb2.ProduceRecordsRequest,
        "Subscribe": records_pb2.SubscribeRequest,
    }[method]
    msg = json_format.Parse(body, cls())
    assert msg.ByteSize() > 0


def test_every_grpcurl_example_was_checked() -> None:
    assert len(GRPCURL) == DOC.count("-d '") == 3
