"""What ``wikirag services`` locks its engines with: credentials from the environment, Dask's TLS files, S3 identities.

Every secret comes from the environment of the command that starts the services and reaches each engine through
its environment; none goes into an argv, a record, a log line or a file:

| variable | what it guards |
|---|---|
| ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` | the store's S3 identity: bucket ``wikirag`` only |
| ``WIKIRAG_MLFLOW_S3_KEY``, ``WIKIRAG_MLFLOW_S3_SECRET`` | the MLflow server's S3 identity: ``wikirag-mlflow`` only |
| ``PREFECT_API_AUTH_STRING`` | ``user:password`` the Prefect server requires (its clients send the same) |
| ``MLFLOW_TRACKING_USERNAME``, ``MLFLOW_TRACKING_PASSWORD`` | MLflow's admin user, created on the server's first
  start (its clients read the same variables) |

SeaweedFS takes several identities only from a JSON file: it gets one that lives in memory (a ``memfd`` passed as
``-s3.config=/dev/fd/N``), never on disk. Dask has no passwords: its scheduler and workers require TLS with
certificates of one CA, so only a process that can read the client key (0600 in ``<home>/services/tls``) connects.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rag_core.errors import WikiragError

STORE_BUCKET = "wikirag"
MLFLOW_BUCKET = "wikirag-mlflow"
_S3_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")  # each limited to one bucket: "Read:wikirag"
_RENEW_BEFORE = datetime.timedelta(days=30)


class ServicesError(WikiragError):
    """A service cannot start (port in use, missing credentials) or stopped answering."""


@dataclass(frozen=True)
class S3Identity:
    """One S3 access key; ``repr`` never shows the secret."""

    key: str
    secret: str = field(repr=False)


@dataclass(frozen=True)
class ServiceCredentials:
    """The secrets of the services, from the environment only; ``repr`` shows none of them."""

    store: S3Identity
    mlflow_s3: S3Identity
    prefect_auth: str = field(repr=False)
    mlflow_user: str
    mlflow_password: str = field(repr=False)

    NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "WIKIRAG_MLFLOW_S3_KEY", "WIKIRAG_MLFLOW_S3_SECRET",
             "PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")

    @classmethod
    def from_environment(cls, names: tuple[str, ...] = NAMES) -> ServiceCredentials:
        env = {name: os.environ.get(name, "") for name in cls.NAMES}
        missing = [name for name in names if not env[name]]
        if missing:
            raise ServicesError(f"the services need credentials: export {', '.join(missing)} (values of your "
                                "choice, docs/operations.md \"Real services on one machine\") before "
                                "`wikirag services up`")
        if "PREFECT_API_AUTH_STRING" in names and ":" not in env["PREFECT_API_AUTH_STRING"]:
            raise ServicesError("PREFECT_API_AUTH_STRING must be user:password (basic auth); export it so")
        if "MLFLOW_TRACKING_PASSWORD" in names and len(env["MLFLOW_TRACKING_PASSWORD"]) < 12:
            raise ServicesError("MLFLOW_TRACKING_PASSWORD: MLflow requires at least 12 characters; export a longer one")
        return cls(S3Identity(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]),
                   S3Identity(env["WIKIRAG_MLFLOW_S3_KEY"], env["WIKIRAG_MLFLOW_S3_SECRET"]),
                   env["PREFECT_API_AUTH_STRING"], env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])

    def environment(self) -> dict[str, str]:
        """The secrets under the variables they came from (empty where not given)."""
        return dict(zip(self.NAMES, (self.store.key, self.store.secret, self.mlflow_s3.key, self.mlflow_s3.secret,
                                     self.prefect_auth, self.mlflow_user, self.mlflow_password), strict=True))

    def s3_identities(self) -> bytes:
        """SeaweedFS's ``-s3.config``: the store's identity and MLflow's, each allowed its own bucket only."""
        identities = [{"name": name, "credentials": [{"accessKey": who.key, "secretKey": who.secret}],
                       "actions": [f"{action}:{bucket}" for action in _S3_ACTIONS]}
                      for name, who, bucket in (("wikirag-store", self.store, STORE_BUCKET),
                                                ("wikirag-mlflow", self.mlflow_s3, MLFLOW_BUCKET))]
        return json.dumps({"identities": identities}).encode()


def memory_file(content: bytes) -> int:
    """A file descriptor (inheritable) of a file that exists only in memory: ``/dev/fd/N`` reads ``content``."""
    fd = os.memfd_create("wikirag-config", 0)  # no MFD_CLOEXEC: the engine started next reads it
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def exec_seaweedfs(argv: list[str]) -> None:
    """Replace this process with SeaweedFS (``argv``), its two identities read from the environment.

    The containers' entry point (``python -m runtime.services seaweedfs weed mini ...``): the identities reach
    SeaweedFS as a file in memory and the secrets leave the environment it runs with.
    """
    credentials = ServiceCredentials.from_environment(ServiceCredentials.NAMES[:4])
    fd = memory_file(credentials.s3_identities())
    env = {k: v for k, v in os.environ.items() if k not in ServiceCredentials.NAMES}
    os.execvpe(argv[0], [*argv, f"-s3.config=/dev/fd/{fd}"], env)


# -- Dask's TLS ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TlsFiles:
    """A CA, a certificate for the scheduler and workers, and one for clients, under one folder."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def cert(self, role: str) -> Path:
        return self.directory / f"{role}.pem"

    def key(self, role: str) -> Path:
        return self.directory / f"{role}-key.pem"

    def cli_args(self) -> list[str]:
        """``dask scheduler`` and ``dask worker`` options (paths only, no secret)."""
        return ["--tls-ca-file", str(self.ca), "--tls-cert", str(self.cert("cluster")),
                "--tls-key", str(self.key("cluster"))]

    def client_environment(self) -> dict[str, str]:
        """Dask's configuration by environment: ``distributed.Client(address)`` then speaks TLS with the client key.

        Not ``require-encryption``: a shell with these still starts a command's own local cluster (plain TCP on
        loopback); the ``tls://`` address alone makes clients of the services encrypt.
        """
        return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(self.ca),
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(self.cert("client")),
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(self.key("client"))}

    def security(self):
        """The client's ``distributed.Security`` (for this process's own health checks)."""
        from distributed import Security

        return Security(tls_ca_file=str(self.ca), tls_client_cert=str(self.cert("client")),
                        tls_client_key=str(self.key("client")), require_encryption=True)

    def current(self) -> bool:
        """Every file exists and the CA is valid for more than 30 days."""
        from cryptography import x509

        paths = [self.ca, *(p for role in ("cluster", "client") for p in (self.cert(role), self.key(role)))]
        if not all(p.is_file() for p in paths):
            return False
        expires = x509.load_pem_x509_certificate(self.ca.read_bytes()).not_valid_after_utc
        return expires - datetime.datetime.now(datetime.UTC) > _RENEW_BEFORE

    def issue(self, days: int = 365) -> TlsFiles:
        """Write a new CA and its two certificates (keys 0600, the folder 0700); keep them while current."""
        if self.current():
            return self
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)
        now = datetime.datetime.now(datetime.UTC)

        def build(name: str, key, issuer: x509.Name, signer, ca: bool) -> x509.Certificate:
            subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
            builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
                       .serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))
                       .not_valid_after(now + datetime.timedelta(days=days))
                       .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
            if not ca:
                builder = builder.add_extension(x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                builder = builder.add_extension(x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            return builder.sign(signer, hashes.SHA256())

        def write(path: Path, data: bytes, mode: int) -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(path, mode)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wikirag-dask-ca")])
        ca_cert = build("wikirag-dask-ca", ca_key, ca_name, ca_key, ca=True)
        for role in ("cluster", "client"):
            key = ec.generate_private_key(ec.SECP256R1())
            write(self.key(role), key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()), 0o600)
            write(self.cert(role), build(f"wikirag-dask-{role}", key, ca_name, ca_key, ca=False)
                  .public_bytes(serialization.Encoding.PEM), 0o644)
        write(self.ca, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)  # last: current() looks at it
        return self
