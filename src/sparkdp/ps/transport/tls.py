"""Optional TLS: a self-signed certificate made at job start, pinned by the workers.

The driver generates a fresh key and certificate (``cryptography``) when it starts the
server and ships the certificate's PEM with the connect info; workers trust exactly that
certificate (no CA, no hostname check: the pin is the trust anchor, and the HMAC
handshake still authenticates both ends on top).  TLS adds confidentiality of the
tensors; integrity is already covered by the MACs.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile

from sparkdp.errors import EnvironmentProblem

_VALID_DAYS = 36525  # ~100 years; dates past 2049 are encoded as GeneralizedTime (RFC 5280)


def make_server_context() -> tuple[ssl.SSLContext, str]:
    """(server SSL context, certificate PEM to hand to the workers)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:
        raise EnvironmentProblem(
            f"TLS for the parameter server needs the 'cryptography' package ({exc}); "
            "pip install cryptography, or run with tls=False (the MACs still authenticate every frame)."
        ) from exc
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sparkdp-parameter-server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    # The pinned certificate is the trust anchor, not a rotating credential: a fresh key is made
    # for every server, so a short lifetime protects nothing and would only break async jobs
    # that run longer than it.  notBefore a day back: executors whose clocks lag the driver's.
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # load_cert_chain only reads files: write them 0600 in a private temp dir, delete at once
    with tempfile.TemporaryDirectory(prefix="sparkdp-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for path, data in ((cert_path, cert_pem.encode()), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx, cert_pem


def make_client_context(cert_pem: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # the pinned certificate is the identity, not a host name
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=cert_pem)
    return ctx
