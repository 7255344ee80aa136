# tls.sh: test certificates made with openssl (sourced, not run). tls_certs DIR writes there:
# ca.pem/ca.key (a CA), server.pem/server.key (signed by it, for IP 127.0.0.1 and DNS
# localhost) and otherca.pem/otherca.key (an unrelated CA); keys mode 0600. Returns non-zero
# (openssl's output in DIR/openssl.log) if any is missing.
tls_certs() {
    d=$1
    mkdir -p "$d"
    for ca in ca otherca; do
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
            -subj "/CN=mge test $ca" -keyout "$d/$ca.key" -out "$d/$ca.pem" >>"$d/openssl.log" 2>&1
    done
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
        -keyout "$d/server.key" -out "$d/server.csr" >>"$d/openssl.log" 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/san.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 2 -extfile "$d/san.ext" -out "$d/server.pem" >>"$d/openssl.log" 2>&1
    chmod 600 "$d"/*.key
    [ -s "$d/server.pem" ] && [ -s "$d/otherca.pem" ]
}
