# nbd-client with TLS (GnuTLS, TLS 1.2) and its certificate options against a server that
# requires TLS and a client certificate; a plaintext client is refused.

tls_round_trip() {
    local dev=/dev/nbd1 status=0 pki=/host/pki
    connect $dev disk --certfile $pki/client-cert.pem --keyfile $pki/client-key.pem \
        --cacertfile $pki/ca-cert.pem --tlshostname localhost || return 1
    dd if=/dev/urandom of=/tmp/data bs=1M count=8 2>/dev/null
    dd if=/tmp/data of=$dev bs=1M oflag=direct 2>/dev/null || status=1
    disconnect $dev
    connect $dev disk --certfile $pki/client-cert.pem --keyfile $pki/client-key.pem \
        --cacertfile $pki/ca-cert.pem --tlshostname localhost || return 1
    dd if=$dev of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null || status=1
    cmp /tmp/data /tmp/back || status=1
    disconnect $dev
    return $status
}

plaintext_refused() {
    if connect /dev/nbd2 disk 2>/tmp/err; then
        disconnect /dev/nbd2
        echo "a plaintext client was served"
        return 1
    fi
    note "plaintext nbd-client: $(tr '\n' ' ' </tmp/err)"
    # Refused for wanting TLS, not for anything else.
    grep -qi tls /tmp/err || { cat /tmp/err; return 1; }
}

check "nbd-client over TLS with a client certificate" tls_round_trip
check "plaintext client refused" plaintext_refused
