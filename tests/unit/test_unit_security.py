"""Which TLS each link uses, and how clusters are given their certificates."""

from __future__ import annotations

import os
import ssl
import stat

import pytest

from pathways_nb._core import NO_TLS, BrokenError, TLSContexts
from pathways_nb.client._discovery import client_tls, security_for
from pathways_nb.deploy._security import cluster_security, command_options

pytest.importorskip("cryptography")
from distributed.security import Security


@pytest.fixture(scope="module")
def temporary() -> Security:
    return Security.temporary()


def test_contexts_come_from_dask_security_by_role(temporary: Security) -> None:
    host = TLSContexts.from_security(temporary, "worker", listen=True)
    assert isinstance(host.server, ssl.SSLContext) and isinstance(host.client, ssl.SSLContext)
    assert host.server.verify_mode == ssl.CERT_REQUIRED  # clients must show a certificate
    assert host.required
    client = TLSContexts.from_security(temporary, "client", listen=False)
    assert client.server is None and client.client is not None


def test_a_tls_address_needs_a_client_context_and_a_plain_one_is_refused_when_required(
    temporary: Security,
) -> None:
    tls = client_tls(temporary)
    assert tls.for_address("tls://10.0.0.1:5000") is tls.client
    with pytest.raises(BrokenError, match=r"does not use TLS.*requires encryption"):
        tls.for_address("tcp://10.0.0.1:5000", "a host")
    assert tls.for_address("inproc://host-1") is None  # in one process, nothing to encrypt
    with pytest.raises(BrokenError, match=r"the controller at tls://h:1 uses TLS.*security="):
        NO_TLS.for_address("tls://h:1", "the controller")
    assert NO_TLS.for_address("tcp://10.0.0.1:5000") is None
    relaxed = TLSContexts(client=tls.client, required=False)
    assert relaxed.for_address("tcp://10.0.0.1:5000") is None


def test_security_for_a_client(temporary: Security, monkeypatch: pytest.MonkeyPatch) -> None:
    assert security_for("tcp://h:8786") is None
    assert security_for("tls://h:8786", temporary) is temporary
    # A plain Dask cluster's own Security (no certificates) asks for nothing.
    assert security_for("tcp://h:8786", Security()) is None
    assert client_tls(None) is NO_TLS
    with pytest.raises(TypeError, match=r"distributed\.Security.*got str"):
        security_for("tls://h:8786", "certs.pem")
    monkeypatch.delenv("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", raising=False)
    with pytest.raises(ValueError, match=r"tls://h:8786 uses TLS.*tls_ca_file=.*distributed\.comm"):
        security_for("tls://h:8786")


def test_a_cluster_security_is_checked_and_written_for_its_commands(
    temporary: Security, tmp_path: os.PathLike[str]
) -> None:
    assert cluster_security(None) is None and cluster_security(False) is None
    made = cluster_security(True)
    assert made.get_connection_args("client")["ssl_context"] is not None
    assert cluster_security(temporary) is temporary
    with pytest.raises(TypeError, match=r"True.*False.*distributed\.Security; got str"):
        cluster_security("yes")
    with pytest.raises(ValueError, match="lacks tls_ca_file, tls_client_cert"):
        cluster_security(Security())

    folder = str(tmp_path)
    options = command_options(temporary, "worker", folder)
    assert options[:2] == ["--protocol", "tls"]
    files = dict(zip(options[2::2], options[3::2], strict=True))
    assert set(files) == {"--tls-ca-file", "--tls-cert", "--tls-key"}
    for path in files.values():
        assert os.path.dirname(path) == folder
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # a private key among them
    with open(files["--tls-key"]) as f:
        assert f.read() == temporary.tls_worker_key
    # The CA every role names is written into the cluster's folder once.
    ca = files["--tls-ca-file"]
    os.utime(ca, ns=(1, 1))
    assert command_options(temporary, "scheduler", folder)[3] == ca
    assert os.stat(ca).st_mtime_ns == 1
    # Certificates given as files are passed as they are.
    on_disk = Security(
        tls_ca_file=files["--tls-ca-file"],
        tls_scheduler_cert=files["--tls-cert"],
        tls_scheduler_key=files["--tls-key"],
    )
    assert command_options(on_disk, "scheduler", "/nonexistent")[3] == files["--tls-ca-file"]


def test_the_cluster_command_takes_all_three_tls_files_or_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pathways_nb.deploy._cli import main as cli

    with pytest.raises(SystemExit) as info:
        cli(["cluster", "--tls-cert", "node.pem"])
    assert info.value.code == 2
    assert "TLS takes all of --tls-ca-file, --tls-cert and --tls-key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["cluster", "--tls", "--tls-ca-file", "ca.pem"])
    assert "--tls makes the cluster's certificates" in capsys.readouterr().err
