"""Keys for the TLS rows: a CA and a certificate for localhost made with GnuTLS's certtool,
laid out as the servers read them (DIR/ca-cert.pem, server-cert.pem, server-key.pem), and
a HOME whose .pki/libnbd/ca-cert.pem is where libnbd looks when a URI names no
certificates. fio's nbd engine cannot pass a key file in the URI (libnbd refuses local
files in URIs unless the program allows them, and fio does not), so the TLS rows use
X.509; once the session is up, the cipher and the cost per byte are the same as with PSK.
"""

import os
import shutil
import subprocess
from typing import Optional, Tuple


def _certtool(cwd: str, args: list) -> None:
    subprocess.run(["certtool"] + args, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def make(workdir: str) -> Optional[Tuple[str, str]]:
    """(server certificate dir, HOME for the client), or None without certtool."""
    if shutil.which("certtool") is None:
        return None
    d = os.path.join(workdir, "tls")
    server = os.path.join(d, "server")
    home = os.path.join(d, "home")
    os.makedirs(server, exist_ok=True)
    os.makedirs(os.path.join(home, ".pki", "libnbd"), exist_ok=True)
    with open(os.path.join(d, "ca.info"), "w") as f:
        f.write("cn = sluice bench CA\nca\ncert_signing_key\nexpiration_days = 7\n")
    with open(os.path.join(d, "server.info"), "w") as f:
        f.write("cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\n"
                "tls_www_server\nsigning_key\nencryption_key\nexpiration_days = 7\n")
    _certtool(d, ["--generate-privkey", "--key-type=ecdsa", "--outfile", "ca-key.pem"])
    _certtool(d, ["--generate-self-signed", "--load-privkey", "ca-key.pem", "--template",
                  "ca.info", "--outfile", "ca-cert.pem"])
    _certtool(d, ["--generate-privkey", "--key-type=ecdsa", "--outfile",
                  os.path.join(server, "server-key.pem")])
    _certtool(d, ["--generate-certificate", "--load-privkey",
                  os.path.join(server, "server-key.pem"), "--load-ca-certificate", "ca-cert.pem",
                  "--load-ca-privkey", "ca-key.pem", "--template", "server.info", "--outfile",
                  os.path.join(server, "server-cert.pem")])
    shutil.copy(os.path.join(d, "ca-cert.pem"), os.path.join(server, "ca-cert.pem"))
    shutil.copy(os.path.join(d, "ca-cert.pem"), os.path.join(home, ".pki", "libnbd", "ca-cert.pem"))
    return server, home
