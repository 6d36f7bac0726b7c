"""The TLS listener's defaults pass a real scanner: testssl.sh (Debian's ``testssl``).

The gateway, started through its CLI with an RSA certificate (so the RSA-key-exchange and
CBC suites a weak default would offer can be negotiated at all) and no ``ssl_*`` keys of
its own, is scanned for protocols, cipher categories, forward secrecy and the known
vulnerabilities (LUCKY13, SWEET32, BEAST, POODLE, ...). Any finding above INFO fails.
With nginx's old default (``HIGH:!aNULL:!MD5``) this scan reported LUCKY13, obsolete CBC
suites and 16 suites without forward secrecy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("testssl") is None, reason="testssl (Debian's testssl.sh) is not installed"),
]


def rsa_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "rsa.crt", directory / "rsa.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "2",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def findings(report: Path) -> list[dict[str, str]]:
    data = json.loads(report.read_text())
    out: list[dict[str, str]] = []
    for section in data["scanResult"][0].values():
        if isinstance(section, list):
            out.extend(section)
    return out


def test_default_tls_settings_have_no_weak_protocol_suite_or_vulnerability(gateway_factory, tmp_path):
    cert, key = rsa_certificate(tmp_path)
    gw = gateway_factory(
        lambda port: (
            f"""
listen: 127.0.0.1:{port} ssl
ssl_certificate: {cert}
ssl_certificate_key: {key}
upstreams:
  app: {{servers: [127.0.0.1:9]}}
routes:
  - location: /
    return: {{code: 200, text: ok}}
"""
        )
    )
    report = tmp_path / "testssl.json"
    scan = subprocess.run(
        ["testssl", "--quiet", "--color", "0", "--warnings", "off", "--openssl-timeout", "5",
         "--jsonfile-pretty", str(report), "-p", "-s", "-f", "-U", f"127.0.0.1:{gw.port}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert report.exists(), scan.stdout[-2000:] + scan.stderr[-2000:]
    found = findings(report)
    assert sum(1 for f in found if f.get("severity") == "OK") >= 20, "the scan did not run its checks"
    offered = {f["id"]: f["finding"] for f in found if f["id"] in ("TLS1_2", "TLS1_3", "TLS1_1", "TLS1", "SSLv3")}
    assert offered.get("TLS1_2", "").startswith("offered") and offered.get("TLS1_3", "").startswith("offered")
    weak = [f"{f['id']} [{f['severity']}]: {f['finding']}" for f in found if f.get("severity") not in ("OK", "INFO")]
    assert not weak, "\n".join(weak)
