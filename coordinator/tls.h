/*
 * tls.h: the certificate and key mge-coordinator serves HTTPS with (--tls-cert, --tls-key),
 * read and checked before anything listens, so that a bad file refuses the start with a message
 * naming it instead of a handshake failure later. Checked with GnuTLS, the library
 * libmicrohttpd serves TLS with: the certificate file (PEM, the chain after the leaf) parses,
 * the key file (PEM, unencrypted) parses and is not readable or writable by others (a key open
 * to every local user is refused; group access is allowed, e.g. Debian's ssl-cert group), and
 * the key is the certificate's.
 */
#ifndef MGE_COORDINATOR_TLS_H
#define MGE_COORDINATOR_TLS_H

struct mge_tls_pem {
    char *cert; /* the certificate file's PEM text, NUL-terminated */
    char *key;  /* the key file's */
};

/*
 * Read and check @cert_path and @key_path into @out (mge_tls_pem_fini). Every refusal is logged
 * with the file it is about; returns MGE_OK, or MGE_NOENT, MGE_IO, MGE_INVAL, MGE_FORBIDDEN.
 */
int mge_tls_pem_load(const char *cert_path, const char *key_path, struct mge_tls_pem *out);
/* Free what @p holds (the key text is wiped first); zeroed @p does nothing. */
void mge_tls_pem_fini(struct mge_tls_pem *p);

#endif
