"""Make substrate's mTLS credentials: a CA, and leaf certificates for its components.

    python scripts/issue_cert.py ca --out DIR --trust-domain TD
    python scripts/issue_cert.py leaf --ca-dir DIR --out DIR --kind KIND [--name NAME]
        --trust-domain TD [--dns NAME]... [--ip ADDR]... [--file-name NAME] [--valid-days N]

``ca`` writes ``ca.crt`` and ``ca.key`` (0600). ``leaf`` writes ``<file-name>.crt``,
``<file-name>.key`` (0600) and a copy of ``ca.crt`` into ``--out``: exactly what each
daemon reads from its ``--tls-dir`` (``ateapi``, ``router``, ``atelet``, ``worker``).

The Kubernetes manifests (``deploy/kubernetes``) run this as the init container of the
atelet and worker pods, whose identities name their node (``atelet/<node>``) and their pod
(``worker/<pod name>``) and so cannot be issued ahead of time; the image installs it as
``ate-issue-cert``. ateapi and router certificates are issued once with it and stored in a
Secret.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from substrate.errors import SubstrateError
from substrate.identity import CertificateAuthority, Identity, IdentityKind
from substrate.identity.ca import DEFAULT_DNS_NAMES, DEFAULT_IP_ADDRESSES
from substrate.identity.files import load_ca, write_bundle, write_ca


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ate-issue-cert", description="make substrate's CA and component certificates"
    )
    sub = p.add_subparsers(dest="command", required=True)

    ca = sub.add_parser("ca", help="create a new CA (ca.crt, ca.key)")
    ca.add_argument("--out", type=Path, required=True, help="directory to write into")
    ca.add_argument("--trust-domain", required=True, help="SPIFFE trust domain")
    ca.add_argument("--valid-days", type=int, default=3650)

    leaf = sub.add_parser("leaf", help="issue one component's certificate from a CA")
    leaf.add_argument("--ca-dir", type=Path, required=True, help="directory with ca.crt, ca.key")
    leaf.add_argument("--out", type=Path, required=True, help="the component's --tls-dir")
    leaf.add_argument(
        "--kind", required=True, choices=[k.value for k in IdentityKind], help="identity kind"
    )
    leaf.add_argument("--name", default="", help="node (atelet), worker or client name")
    leaf.add_argument("--trust-domain", required=True, help="SPIFFE trust domain")
    leaf.add_argument(
        "--dns", action="append", default=[], help="DNS SAN (repeat; default: localhost)"
    )
    leaf.add_argument(
        "--ip", action="append", default=[], help="IP SAN (repeat; default: 127.0.0.1, ::1)"
    )
    leaf.add_argument(
        "--file-name", default="", help="bundle name: <file-name>.crt/.key (default: the kind)"
    )
    leaf.add_argument("--valid-days", type=int, default=365)
    return p


def identity_for(kind: str, name: str, trust_domain: str) -> Identity:
    """The identity of ``kind`` (with ``name`` where the kind takes one)."""
    k = IdentityKind(kind)
    return Identity(k, trust_domain, name if k.has_name else "")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    now = datetime.now(UTC)
    try:
        if args.command == "ca":
            authority = CertificateAuthority.create(
                args.trust_domain, now=now, valid_for=timedelta(days=args.valid_days)
            )
            cert, _key = write_ca(args.out, authority)
            print(f"wrote {cert} and its key for trust domain {args.trust_domain}")
            return 0
        authority = load_ca(args.ca_dir)
        identity = identity_for(args.kind, args.name, args.trust_domain)
        issued = authority.issue(
            identity,
            now=now,
            valid_for=timedelta(days=args.valid_days),
            dns_names=args.dns or DEFAULT_DNS_NAMES,
            ip_addresses=args.ip or DEFAULT_IP_ADDRESSES,
        )
        files = write_bundle(args.out, args.file_name or args.kind, issued)
    except (SubstrateError, OSError, ValueError) as exc:
        print(f"ate-issue-cert: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {files.cert} for {identity}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
