"""What a TLS client is told when the listener it reaches speaks no TLS. Found from outside:
the README's Security section leaves STROM_SSL_* exported, the next section's cluster is
plaintext, and every command failed with a hint about CAs and client certificates, which
sent the user the wrong way. The handshake's WRONG_VERSION_NUMBER now says what it means."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.client.cluster import ClusterClient
from strom.devcluster.certs import CertificateAuthority
from strom.devcluster.cluster import LocalCluster
from strom.errors import AuthenticationError
from strom.security.channel import ChannelSecurity


def test_a_tls_client_at_a_plaintext_listener_is_told_to_drop_its_tls_settings(
    one_node_cluster: LocalCluster, tmp_path: Path
) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    security = ChannelSecurity.from_files(ca.ca_file)
    with (
        ClusterClient(one_node_cluster.bootstrap, retry_s=5, security=security) as client,
        pytest.raises(AuthenticationError) as info,
    ):
        client.metadata()
    message = str(info.value)
    assert "the server does not speak TLS" in message, message
    assert "unset STROM_SSL_CAFILE" in message, message
    assert "is the CA that signed" not in message, message
