"""Credentials in the shapes they take in logs, specs, Events and annotations, and look-alikes that
are no credentials; shared by tests/kube/test_must_gather_redaction.py and the must-gather
end-to-end test (tests/kube/test_must_gather_secrets.py). Every secret is a made-up value found
nowhere else in the corpus, so a test can look for it in a whole archive.

A class named in the issue (URL credentials, PEM keys, cookies, ...) has several examples: its
variants (schemes, quoting, the header in JSON, in a Go map, in curl), not one instance.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shape:
    """A text holding credentials: `secrets` must not survive, `keep` must (what says what the
    value was), and `kind` is what the redaction counts it as."""

    id: str
    cls: str
    text: str
    secrets: tuple[str, ...]
    kind: str
    keep: tuple[str, ...] = field(default=())


def _pem(label: str, *lines: str, begin: bool = True, end: bool = True, sep: str = "\n") -> str:
    parts = [f"-----BEGIN {label}-----"] if begin else []
    parts += list(lines)
    parts += [f"-----END {label}-----"] if end else []
    return sep.join(parts)


_DOCKER_CONFIG = json.dumps(
    {
        "auths": {
            "nvcr.io": {
                "username": "$oauthtoken",
                "password": "Dcfg-pw-0a1",
                "auth": base64.b64encode(b"$oauthtoken:Dcfg-pw-0a1").decode(),
            }
        }
    },
    separators=(",", ":"),
)
_DOCKER_CONFIG_B64 = base64.b64encode(_DOCKER_CONFIG.encode()).decode()
_GHP = "ghp_" + "Gh0kTokenAbcdefghijklmnopqrstuvwxyz12"
_GH_PAT = "github_pat_11ABCDEFG0123456789_" + "abcdefghijklmnopqrstuvwxyz" * 2 + "0123456789"
_JWT = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6Ik1ZS0VZIn0"
    ".eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50Iiwic3ViIjoic3lzdGVtOnNhOmdwdSJ9"
    ".SigJwtPartQ1w2e3r4t5y6u7i8o9p0"
)

SHAPES: tuple[Shape, ...] = (
    # --- user:password in URLs and DSNs (also under innocent names: DATABASE_URL=...)
    Shape(
        "url-postgres",
        "url-credentials",
        "DATABASE_URL=postgres://app:Pw0rd-pg-1@db.internal:5432/app",
        ("Pw0rd-pg-1",),
        "url-credentials",
        ("postgres://app:", "@db.internal:5432/app"),
    ),
    Shape(
        "url-https-registry",
        "url-credentials",
        "pulling from https://deploy:Hunter2-reg@registry.example.com/v2/",
        ("Hunter2-reg",),
        "url-credentials",
        ("https://deploy:", "@registry.example.com/v2/"),
    ),
    Shape(
        "url-empty-user",
        "url-credentials",
        "REDIS=redis://:R3dis-pass-9@redis:6379/0",
        ("R3dis-pass-9",),
        "url-credentials",
        ("redis://:", "@redis:6379/0"),
    ),
    Shape(
        "url-percent-encoded",
        "url-credentials",
        "mongodb+srv://admin:S3cr%40t-mongo@cluster0.example.net/db",
        ("S3cr%40t-mongo", "S3cr"),
        "url-credentials",
        ("mongodb+srv://admin:",),
    ),
    Shape(
        "url-unencoded-at",
        "url-credentials",
        "BROKER=amqp://guest:Gu3st@pw-amqp@rabbit:5672/",
        ("Gu3st", "pw-amqp@"),
        "url-credentials",
        ("@rabbit:5672/",),
    ),
    Shape(
        "url-quoted-json",
        "url-credentials",
        '{"url": "ftp://user:Ftp-pass-77@files.example.com/pub"}',
        ("Ftp-pass-77",),
        "url-credentials",
        ("ftp://user:",),
    ),
    Shape(
        "url-mysql-dsn",
        "url-credentials",
        "dsn app:Mysql-pw-42@tcp(mysql:3306)/shop",
        ("Mysql-pw-42",),
        "url-credentials",
        ("app:", "@tcp(mysql:3306)/shop"),
    ),
    Shape(
        "url-token-user",
        "url-credentials",
        "git clone https://x9Fk2LmQ7pRt4VwZ8bYc3Tk@git.example.com/org/repo.git",
        ("x9Fk2LmQ7pRt4VwZ8bYc3Tk",),
        "url-credentials",
        ("@git.example.com/org/repo.git",),
    ),
    # --- secret-named URL query parameters, signed URLs
    Shape(
        "query-token",
        "query-parameter",
        "GET https://api.example.com/v1/items?limit=5&token=Qtok-123abc HTTP/1.1",
        ("Qtok-123abc",),
        "query-parameter",
        ("limit=5&token=", " HTTP/1.1"),
    ),
    Shape(
        "query-apikey",
        "query-parameter",
        "https://maps.example.com/geo?apikey=Apikey-77x&format=json",
        ("Apikey-77x",),
        "query-parameter",
        ("&format=json",),
    ),
    Shape(
        "query-access-token",
        "query-parameter",
        "callback https://app.example.com/cb?state=1&access_token=Acc-tok-9#frag",
        ("Acc-tok-9",),
        "query-parameter",
        ("#frag",),
    ),
    Shape(
        "query-api-key",
        "query-parameter",
        "https://x.example.com/?api_key=Api-key-88",
        ("Api-key-88",),
        "query-parameter",
    ),
    Shape(
        "query-sas-sig",
        "query-parameter",
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=SaS%2Bsig-4242&se=2030-01-01",
        ("SaS%2Bsig-4242",),
        "query-parameter",
        ("sv=2022-11-02", "&se=2030-01-01"),
    ),
    Shape(
        "query-s3-presigned",
        "query-parameter",
        "https://bucket.s3.amazonaws.com/o?X-Amz-Signature=5e1a9c0ffee4242&X-Amz-Security-Token=Sts-tok-1",
        ("5e1a9c0ffee4242", "Sts-tok-1"),
        "query-parameter",
    ),
    Shape(
        "query-password",
        "query-parameter",
        "login https://h.example.com/login?user=bob&password=Qpass-5",
        ("Qpass-5",),
        "query-parameter",
        ("user=bob",),
    ),
    # --- PEM private keys: every flavour, every way a log shows one
    Shape(
        "pem-rsa",
        "private-key",
        _pem("RSA PRIVATE KEY", "MIIEpAIBAAKCAQEArsaLineOne0", "RsaLineTwo0ab+/cd=="),
        ("MIIEpAIBAAKCAQEArsaLineOne0", "RsaLineTwo0ab+/cd=="),
        "private-key",
        ("-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----"),
    ),
    Shape(
        "pem-pkcs8",
        "private-key",
        _pem("PRIVATE KEY", "MIIEvQIBADANBgkqPkcs8LineA", "Pkcs8LineB"),
        ("MIIEvQIBADANBgkqPkcs8LineA", "Pkcs8LineB"),
        "private-key",
        ("-----BEGIN PRIVATE KEY-----",),
    ),
    Shape(
        "pem-ec",
        "private-key",
        _pem("EC PRIVATE KEY", "MHcCAQEEIEcLineOne", "EcLineTwo"),
        ("MHcCAQEEIEcLineOne", "EcLineTwo"),
        "private-key",
    ),
    Shape(
        "pem-openssh",
        "private-key",
        _pem("OPENSSH PRIVATE KEY", "b3BlbnNzaC1rZXktdjEOpensshA", "OpensshLineB"),
        ("b3BlbnNzaC1rZXktdjEOpensshA", "OpensshLineB"),
        "private-key",
    ),
    Shape(
        "pem-encrypted-pkcs8",
        "private-key",
        _pem("ENCRYPTED PRIVATE KEY", "MIIFHDBOBgkqEncLineA"),
        ("MIIFHDBOBgkqEncLineA",),
        "private-key",
    ),
    Shape(
        "pem-rsa-proc-type",
        "private-key",
        _pem(
            "RSA PRIVATE KEY",
            "Proc-Type: 4,ENCRYPTED",
            "DEK-Info: AES-128-CBC,0A1B2C3D4E5F",
            "",
            "ProcTypeBodyLine1",
        ),
        ("ProcTypeBodyLine1", "0A1B2C3D4E5F"),
        "private-key",
    ),
    Shape(
        "pem-pgp",
        "private-key",
        _pem("PGP PRIVATE KEY BLOCK", "lQOYBGPgpLineOne", "=PgpCrc"),
        ("lQOYBGPgpLineOne", "=PgpCrc"),
        "private-key",
    ),
    Shape(
        "pem-crlf",
        "private-key",
        _pem("PRIVATE KEY", "CrlfLineOne", "CrlfLineTwo", sep="\r\n"),
        ("CrlfLineOne", "CrlfLineTwo"),
        "private-key",
    ),
    Shape(
        "pem-json-escaped",
        "private-key",
        '{"tls.key":"'
        + _pem("PRIVATE KEY", "JsonEscLineOne", "JsonEscLineTwo", sep="\\n")
        + '\\n"}',
        ("JsonEscLineOne", "JsonEscLineTwo"),
        "private-key",
        ('{"tls.key":"',),
    ),
    Shape(
        "pem-json-escaped-cut",
        "private-key",
        '{"key":"'
        + _pem("PRIVATE KEY", "JsonCutLineOne", "JsonCutPar9", end=False, sep="\\n")
        + '"}',
        ("JsonCutLineOne", "JsonCutPar9"),
        "private-key",
        ('"}',),
    ),
    Shape(
        "pem-one-line",
        "private-key",
        "key=" + _pem("PRIVATE KEY", "OneLineBodyA", "OneLineBodyB", sep=" "),
        ("OneLineBodyA", "OneLineBodyB"),
        "private-key",
    ),
    Shape(
        "pem-cut-after-begin",
        "private-key",
        _pem("RSA PRIVATE KEY", "CutAfterBeginA", "CutAfterBe", end=False),
        ("CutAfterBeginA", "CutAfterBe"),
        "private-key",
        ("-----BEGIN RSA PRIVATE KEY-----",),
    ),
    Shape(
        "pem-tail-before-end",
        "private-key",
        _pem("EC PRIVATE KEY", "TailBeforeEndA", "TailBeforeEndB", begin=False),
        ("TailBeforeEndA", "TailBeforeEndB"),
        "private-key",
        ("-----END EC PRIVATE KEY-----",),
    ),
    # --- Authorization headers and Bearer tokens
    Shape(
        "auth-bearer",
        "authorization",
        "Authorization: Bearer Bt0k-abc.def-123",
        ("Bt0k-abc.def-123",),
        "authorization",
        ("Authorization: Bearer ",),
    ),
    Shape(
        "auth-basic",
        "authorization",
        "Authorization: Basic dXNlcjpCYXNpYy1wdy05OQ==",
        ("dXNlcjpCYXNpYy1wdy05OQ==",),
        "authorization",
        ("Authorization: Basic ",),
    ),
    Shape(
        "auth-token-scheme-lowercase",
        "authorization",
        "authorization: token Gt0ken-scheme-456",
        ("Gt0ken-scheme-456",),
        "authorization",
    ),
    Shape(
        "auth-proxy",
        "authorization",
        "Proxy-Authorization: Basic cHJveHk6UHJveHktcHc=",
        ("cHJveHk6UHJveHktcHc=",),
        "authorization",
    ),
    Shape(
        "auth-go-header-map",
        "authorization",
        "headers map[Accept:[*/*] Authorization:[Bearer GoB3arer-77]]",
        ("GoB3arer-77",),
        "authorization",
        ("Accept:[*/*]",),
    ),
    Shape(
        "auth-json",
        "authorization",
        '{"Authorization": "Bearer JsonB3arer-88", "Accept": "*/*"}',
        ("JsonB3arer-88",),
        "authorization",
        ('"Accept": "*/*"',),
    ),
    Shape(
        "auth-curl",
        "authorization",
        "curl -H 'Authorization: Bearer CurlB3arer-99' https://api.example.com/",
        ("CurlB3arer-99",),
        "authorization",
        ("https://api.example.com/",),
    ),
    Shape(
        "auth-digest",
        "authorization",
        'Authorization: Digest username="bob", realm="api", nonce="n1", response="D1gest-resp-0f"',
        ("D1gest-resp-0f",),
        "authorization",
        ("Authorization: Digest ",),
    ),
    Shape(
        "auth-aws4",
        "authorization",
        "Authorization: AWS4-HMAC-SHA256 "
        "Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
        "SignedHeaders=host, Signature=Aws4Sig5d2c",
        ("Aws4Sig5d2c",),
        "authorization",
    ),
    Shape(
        "auth-bearer-in-prose",
        "authorization",
        "retrying with Bearer StBearer.tok-3 after 401",
        ("StBearer.tok-3",),
        "authorization",
        ("after 401",),
    ),
    # --- cookies
    Shape(
        "cookie-request",
        "cookie",
        "Cookie: session=Sess-c00k-1; csrftoken=Csrf-c00k-2",
        ("Sess-c00k-1", "Csrf-c00k-2"),
        "cookie",
        ("session=", "csrftoken="),
    ),
    Shape(
        "cookie-set",
        "cookie",
        "Set-Cookie: sid=Sid-c00k-3; Path=/; HttpOnly; Secure",
        ("Sid-c00k-3",),
        "cookie",
        ("sid=", "Path=/; HttpOnly; Secure"),
    ),
    Shape(
        "cookie-lowercase", "cookie", "set-cookie: remember=Rem-c00k-4", ("Rem-c00k-4",), "cookie"
    ),
    Shape(
        "cookie-json",
        "cookie",
        '{"cookie": "auth=Json-c00k-5", "path": "/"}',
        ("Json-c00k-5",),
        "cookie",
        ('"path": "/"',),
    ),
    Shape(
        "cookie-go-map",
        "cookie",
        "map[Cookie:[sid=Go-c00k-6] Host:[x]]",
        ("Go-c00k-6",),
        "cookie",
        ("Host:[x]",),
    ),
    # --- command-line arguments
    Shape(
        "arg-two-words",
        "argument",
        "exec /usr/bin/app --password Two-arg-pw-1 --verbose",
        ("Two-arg-pw-1",),
        "argument",
        ("--password ", " --verbose"),
    ),
    Shape(
        "arg-equals",
        "argument",
        "args: --password=Eq-arg-pw-2 --port=8080",
        ("Eq-arg-pw-2",),
        "argument",
        ("--port=8080",),
    ),
    Shape(
        "arg-docker-auth",
        "argument",
        "--docker-auth=Dock-auth-3",
        ("Dock-auth-3",),
        "argument",
        ("--docker-auth=",),
    ),
    Shape(
        "arg-go-single-dash",
        "argument",
        "./agent -token Go-flag-tok-4 -v 2",
        ("Go-flag-tok-4",),
        "argument",
        ("-v 2",),
    ),
    Shape(
        "arg-single-quoted",
        "argument",
        "--api-key 'Quoted arg key 5'",
        ("Quoted arg key 5", "arg key"),
        "argument",
    ),
    Shape(
        "arg-double-quoted",
        "argument",
        '--client-secret="Dq arg sec 6"',
        ("Dq arg sec 6", "arg sec"),
        "argument",
    ),
    Shape(
        "arg-db-pass",
        "argument",
        "mysqldump --db-pass Db-pass-arg-7 shop",
        ("Db-pass-arg-7",),
        "argument",
        (" shop",),
    ),
    # --- values named like a credential, in every syntax a log or a config shows
    Shape(
        "named-yaml",
        "named-value",
        "password: Yaml-pw-1",
        ("Yaml-pw-1",),
        "named-value",
        ("password: ",),
    ),
    Shape(
        "named-json",
        "named-value",
        '{"token": "Json tok 2", "user": "bob"}',
        ("Json tok 2", "tok 2"),
        "named-value",
        ('"user": "bob"',),
    ),
    Shape(
        "named-form",
        "named-value",
        "grant_type=client_credentials client_secret=Kv-sec-3",
        ("Kv-sec-3",),
        "named-value",
        ("grant_type=client_credentials",),
    ),
    Shape(
        "named-shell",
        "named-value",
        'export DB_PASSWORD="Sh quoted 4"',
        ("Sh quoted 4", "quoted 4"),
        "named-value",
        ("export DB_PASSWORD=",),
    ),
    Shape(
        "named-go-struct",
        "named-value",
        "config {Password:Go-pw-5 User:bob}",
        ("Go-pw-5",),
        "named-value",
        ("User:bob}",),
    ),
    Shape(
        "named-env-yaml",
        "named-value",
        "- name: NGC_API_KEY\n  value: Env-yaml-6\n- name: LOG\n  value: debug",
        ("Env-yaml-6",),
        "named-value",
        ("value: debug",),
    ),
    Shape(
        "named-env-json",
        "named-value",
        '[{"name":"REGISTRY_TOKEN","value":"Env-json-7"},{"name":"A","value":"b"}]',
        ("Env-json-7",),
        "named-value",
        ('"value":"b"',),
    ),
    Shape(
        "named-env-go",
        "named-value",
        "{Name:MY_PASSWORD Value:Env-go-8 ValueFrom:nil}",
        ("Env-go-8",),
        "named-value",
        ("ValueFrom:nil",),
    ),
    Shape(
        "named-yaml-block",
        "named-value",
        "private_key: |\n  Blk-line-9a\n  Blk-line-9b\nnext: ok",
        ("Blk-line-9a", "Blk-line-9b"),
        "named-value",
        ("next: ok",),
    ),
    Shape(
        "named-dotted",
        "named-value",
        "spring.datasource.password=Dot-pw-10",
        ("Dot-pw-10",),
        "named-value",
    ),
    Shape(
        "named-aws-secret",
        "named-value",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",),
        "named-value",
    ),
    Shape(
        "named-json-in-json",
        "named-value",
        '{"msg":"body {\\"password\\": \\"Esc-json-12\\"}"}',
        ("Esc-json-12",),
        "named-value",
        ('{"msg":"body {',),
    ),
    Shape(
        "named-single-quoted",
        "named-value",
        "export API_KEY='Sq-key-13'",
        ("Sq-key-13",),
        "named-value",
    ),
    Shape(
        "named-weak-last-word",
        "named-value",
        "DB_PASS=Pass-15 SENTRY_DSN=https://Dsn-key-16@o1.example.io/1",
        ("Pass-15", "Dsn-key-16"),
        "named-value",
    ),
    Shape(
        "named-after-json-escape",
        "named-value",
        '{"log":"start\\npassword: Esc-nl-17\\ndone"}',
        ("Esc-nl-17",),
        "named-value",
        ("\\ndone",),
    ),
    # --- tokens recognised by their shape, whatever their name
    Shape(
        "token-jwt",
        "token",
        f"using service account token {_JWT} for the API",
        (_JWT, "SigJwtPartQ1w2e3r4t5y6u7i8o9p0"),
        "jwt",
        ("for the API",),
    ),
    Shape(
        "token-aws-akia",
        "token",
        "credentials AKIAIOSFODNN7EXAMPLE loaded",
        ("AKIAIOSFODNN7EXAMPLE",),
        "aws-access-key",
        ("loaded",),
    ),
    Shape(
        "token-aws-asia",
        "token",
        "session ASIAY34FZKBOKMUTVV7A expires",
        ("ASIAY34FZKBOKMUTVV7A",),
        "aws-access-key",
    ),
    Shape("token-github-classic", "token", f"git push with {_GHP} ok", (_GHP,), "github-token"),
    Shape("token-github-fine-grained", "token", f"GH {_GH_PAT}", (_GH_PAT,), "github-token"),
    Shape(
        "token-gitlab-pat",
        "token",
        "glpat-AbCdEfGhIjKlMnOpQrSt12 used",
        ("glpat-AbCdEfGhIjKlMnOpQrSt12",),
        "gitlab-token",
    ),
    Shape(
        "token-gitlab-deploy",
        "token",
        "gldt-DeployTokenAbcdefghij345",
        ("gldt-DeployTokenAbcdefghij345",),
        "gitlab-token",
    ),
    Shape(
        "token-ngc",
        "token",
        "ngc config set nvapi-NgcKeyAbcdefghijklmnopqrstuvwxyz0123456789ab",
        ("nvapi-NgcKeyAbcdefghijklmnopqrstuvwxyz0123456789ab",),
        "ngc-api-key",
        ("ngc config set",),
    ),
    Shape(
        "token-slack",
        "token",
        "webhook xoxb-123456789012-SlackTokenAbcd",
        ("xoxb-123456789012-SlackTokenAbcd",),
        "slack-token",
    ),
    Shape(
        "token-google",
        "token",
        "maps AIzaSyA1234567890GoogleKeyAbcdefghijklm",
        ("AIzaSyA1234567890GoogleKeyAbcdefghijklm",),
        "google-api-key",
    ),
    Shape(
        "token-after-json-escape",
        "token",
        f'{{"msg":"login\\n{_GHP}\\n"}}',
        (_GHP,),
        "github-token",
    ),
    # --- docker config JSON: raw (`auth` and `password`) and base64-encoded
    Shape(
        "docker-config-json",
        "docker-config",
        _DOCKER_CONFIG,
        ("Dcfg-pw-0a1", base64.b64encode(b"$oauthtoken:Dcfg-pw-0a1").decode()),
        "named-value",
        ('"username":"$oauthtoken"',),
    ),
    Shape(
        "docker-config-base64",
        "docker-config",
        f"config {_DOCKER_CONFIG_B64} written",
        (_DOCKER_CONFIG_B64, _DOCKER_CONFIG_B64[20:60]),
        "encoded-secret",
        ("written",),
    ),
    Shape(
        "docker-config-key",
        "docker-config",
        f".dockerconfigjson: {_DOCKER_CONFIG_B64}",
        (_DOCKER_CONFIG_B64[20:60],),
        "encoded-secret",
    ),
)

# Names whose values are credentials, as env vars, annotation keys, ConfigMap keys, flags and
# keys in a log line. FLAG_NAMES are those that can be flags too.
SECRET_NAMES: tuple[str, ...] = (
    "NGC_API_KEY", "DB_PASSWORD", "docker-auth", "example.com/auth", "ci.example.com/token",
    ".dockerconfigjson", "clientSecret", "AWS_SECRET_ACCESS_KEY", "REGISTRY_TOKEN", "DB_PASS",
    "SENTRY_DSN", "privateKey", "X-Api-Key", "passphrase", "credentials", "webhookSecret",
    "session_cookie", "vault-auth-token", "passwd",
)  # fmt: skip
FLAG_NAMES = tuple(n for n in SECRET_NAMES if n[0].isalpha() and "/" not in n)


def secret_value(name: str) -> str:
    """A made-up value for the secret `name` (found nowhere else)."""
    return "NamedVal-" + "".join(c for c in name if c.isalnum())[:16] + "-7q"


@dataclass(frozen=True)
class LookAlike:
    """A text that must come out of redaction unchanged."""

    id: str
    text: str


_CERT = (
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBkTCB+wIJAKHBfpegPjMCMA0GCSqGSIb3DQEBCwUAMBExDzANBgNVBAMMBnRl\n"
    "c3RjYTAeFw0yNDAxMDEwMDAwMDBa\n"
    "-----END CERTIFICATE-----"
)
_DIGEST = "sha256:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

LOOK_ALIKES: tuple[LookAlike, ...] = (
    LookAlike("image-digest", f"Pulled image nvcr.io/nvidia/driver@{_DIGEST} in 2.1s"),
    LookAlike("image-id", f"imageID: nvcr.io/nvidia/k8s-device-plugin@{_DIGEST}"),
    LookAlike(
        "gpu-uuid",
        "GPU-3f1a2b3c-1234-5678-9abc-def012345678 MIG-8a2b0c4d-5e6f-5a1b-9c2d-3e4f5a6b7c8d",
    ),
    LookAlike("pod-uid", "uid: 6f1c0a0e-1d2b-4c3d-9e8f-0a1b2c3d4e5f"),
    LookAlike("resource-version", 'resourceVersion: "123456789" generation=4'),
    LookAlike("pci-bus-id", "device 00000000:3B:00.0 (0000:af:00.0) healthy"),
    LookAlike("ca-certificate", f"ca.crt: |\n{_CERT}"),
    LookAlike(
        "public-key",
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEpubLine\n"
        "-----END PUBLIC KEY-----",
    ),
    LookAlike(
        "ssh-public-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPub0123456789abcdef ops@host"
    ),
    LookAlike(
        "urls-without-credentials",
        "https://nvcr.io/v2/nvidia/driver/manifests/580 http://10.0.0.1:8080/metrics?x=1",
    ),
    LookAlike(
        "user-without-password",
        "ssh://git@github.com/org/repo.git git@github.com:org/repo.git mailto:ops@example.com",
    ),
    LookAlike(
        "credential-file-flags",
        "--password-file=/etc/app/password --token-file /var/run/secrets/token",
    ),
    LookAlike(
        "credential-setting-flags",
        "--token-ttl=24h --authorization-mode=Node,RBAC --secret-name=ngc-secret",
    ),
    LookAlike(
        "key-fields",
        "key: nvidia.com/gpu\nmonkey: banana\nkeychain: enabled\n"
        "topologyKey: kubernetes.io/hostname",
    ),
    LookAlike(
        "secret-references",
        "secretName: ngc-secret\nsecretKeyRef:\n  name: registry-password\n  key: password\n"
        "imagePullSecrets: [ngc-secret]",
    ),
    LookAlike(
        "env-look-alikes",
        "PWD=/root PASS_DEVICE_SPECS=true SSH_AUTH_SOCK=/tmp/agent.sock "
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    ),
    LookAlike(
        "prose",
        "bearer token is missing; Bearer authentication failed; "
        "authorization failed for user; the cookie jar is empty",
    ),
    LookAlike(
        "value-references",
        "--password=$(DB_PASSWORD) password: ${DB_PASSWORD} token: {{ .Values.token }}",
    ),
    LookAlike(
        "kubectl-describe-env",
        "NGC_API_KEY:  <set to the key 'key' in secret 'ngc'>  Optional: false",
    ),
    LookAlike("masked", "password: ******** token: null auth: none"),
    LookAlike(
        "harmless-base64-json",
        "header eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9 config eyJraW5kIjoiQ29uZmlnIn0=",
    ),
    LookAlike(
        "timestamps-and-versions",
        "2026-01-01T10:00:00Z I0101 10:00:00.123 main.go:42] driver 580.95.05 CUDA_VERSION=12.8.0",
    ),
    LookAlike("labels", "nvidia.com/gpu.deploy.driver=true nvidia.com/mig.config=all-1g.5gb"),
    LookAlike(
        "near-token-prefixes",
        "AKIAshort ghp_short glpat-short nvapi-short d41d8cd98f00b204e9800998ecf8427e",
    ),
    LookAlike("author-and-authority", "author: Jane Doe\nauthority: ca.example.com"),
    LookAlike(
        "kubelet-authorization-config",
        "authorization:\n  mode: Webhook\nauthentication:\n  anonymous:\n    enabled: false",
    ),
)
