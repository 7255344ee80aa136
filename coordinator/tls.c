/* tls.c: read and check the HTTPS certificate and key (see tls.h). */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/err.h"
#include "tls.h"

#define TLS_PEM_MAX (1024 * 1024)

/* Read file @path (what: "certificate" or "key") into a new NUL-terminated string *@out. */
static int pem_read(const char *path, const char *what, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *p = NULL;
    size_t n;
    int rc = MGE_OK;
    *out = NULL;
    if (!f)
        return MGE_ERR(errno == ENOENT ? MGE_NOENT : MGE_IO, "TLS %s file '%s': %s", what, path,
                       strerror(errno));
    p = mge_malloc(TLS_PEM_MAX + 1);
    if (!p) {
        rc = MGE_NOMEM;
        goto out;
    }
    n = fread(p, 1, TLS_PEM_MAX + 1, f);
    if (ferror(f)) {
        rc = MGE_ERR(MGE_IO, "TLS %s file '%s': %s", what, path, strerror(errno));
        goto out;
    }
    if (n > TLS_PEM_MAX || n == 0) {
        rc = MGE_ERR(MGE_INVAL, "TLS %s file '%s' is %s", what, path,
                     n ? "over 1 MiB (not a PEM file?)" : "empty");
        goto out;
    }
    p[n] = '\0';
    *out = p;
    *len = n;
    p = NULL;
out:
    mge_free(p);
    fclose(f);
    return rc;
}

int mge_tls_pem_load(const char *cert_path, const char *key_path, struct mge_tls_pem *out)
{
    gnutls_x509_crt_t *crts = NULL;
    unsigned n_crts = 0;
    gnutls_x509_privkey_t key = NULL;
    gnutls_certificate_credentials_t cred = NULL;
    gnutls_datum_t d;
    size_t cert_len = 0, key_len = 0;
    struct stat sb;
    int rc, g;

    memset(out, 0, sizeof(*out));
    rc = pem_read(cert_path, "certificate", &out->cert, &cert_len);
    if (rc == MGE_OK)
        rc = pem_read(key_path, "key", &out->key, &key_len);
    if (rc != MGE_OK)
        goto out;
    if (stat(key_path, &sb) == 0 && (sb.st_mode & S_IRWXO)) {
        rc = MGE_ERR(MGE_FORBIDDEN,
                     "TLS key file '%s' is open to other users (mode %03o): refusing to serve "
                     "with a key every local user can read; chmod o-rwx '%s'",
                     key_path, (unsigned)(sb.st_mode & 0777), key_path);
        goto out;
    }
    d.data = (unsigned char *)out->cert;
    d.size = (unsigned)cert_len;
    g = gnutls_x509_crt_list_import2(&crts, &n_crts, &d, GNUTLS_X509_FMT_PEM, 0);
    if (g < 0 || n_crts == 0) {
        rc = MGE_ERR(MGE_INVAL, "TLS certificate file '%s' holds no PEM certificate: %s", cert_path,
                     g < 0 ? gnutls_strerror(g) : "none found");
        goto out;
    }
    d.data = (unsigned char *)out->key;
    d.size = (unsigned)key_len;
    if (gnutls_x509_privkey_init(&key) < 0) {
        rc = MGE_NOMEM;
        goto out;
    }
    g = gnutls_x509_privkey_import2(key, &d, GNUTLS_X509_FMT_PEM, NULL, 0);
    if (g < 0) {
        rc = MGE_ERR(MGE_INVAL, "TLS key file '%s' holds no unencrypted PEM private key: %s",
                     key_path, gnutls_strerror(g));
        goto out;
    }
    if (gnutls_certificate_allocate_credentials(&cred) < 0) {
        rc = MGE_NOMEM;
        goto out;
    }
    g = gnutls_certificate_set_x509_key(cred, crts, n_crts, key);
    if (g < 0) {
        rc = MGE_ERR(MGE_INVAL, "TLS key file '%s' does not go with certificate file '%s': %s",
                     key_path, cert_path, gnutls_strerror(g));
        goto out;
    }
out:
    if (cred)
        gnutls_certificate_free_credentials(cred);
    if (key)
        gnutls_x509_privkey_deinit(key);
    for (unsigned i = 0; i < n_crts; i++)
        gnutls_x509_crt_deinit(crts[i]);
    gnutls_free(crts);
    if (rc != MGE_OK)
        mge_tls_pem_fini(out);
    return rc;
}

void mge_tls_pem_fini(struct mge_tls_pem *p)
{
    if (p->key)
        explicit_bzero(p->key, strlen(p->key));
    mge_free(p->key);
    mge_free(p->cert);
    p->key = p->cert = NULL;
}
