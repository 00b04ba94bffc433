//! HTTPS for the server: a throwaway CA made at start-up, a leaf certificate for `127.0.0.1` and
//! `localhost` signed by it, and rustls (with aws-lc-rs, the provider the workspace already
//! builds) on the server side.

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use crate::http::Conn;

/// What a TLS server needs: its rustls configuration, and the CA that clients must trust.
#[derive(Debug)]
pub(crate) struct Tls {
    /// The server configuration, with the leaf certificate and its key.
    pub(crate) config: Arc<ServerConfig>,
    /// The CA certificate, PEM.
    pub(crate) ca_pem: String,
}

/// The rustls crypto provider: aws-lc-rs, named explicitly so that a build with more than one
/// provider compiled in still works.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Makes a fresh CA and a server certificate for 127.0.0.1 and localhost signed by it.
pub(crate) fn make() -> io::Result<Tls> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(io::Error::other)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "stepguard-modelserver test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(io::Error::other)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(io::Error::other)?;
    let ca = Issuer::new(ca_params, ca_key);

    let mut leaf_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .map_err(io::Error::other)?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    leaf_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Strict verifiers (OpenSSL's X509_STRICT, as Python 3.13 sets) want it.
    leaf_params.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().map_err(io::Error::other)?;
    let leaf_cert = leaf_params
        .signed_by(&leaf_key, &ca)
        .map_err(io::Error::other)?;

    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(vec![leaf_cert.der().clone(), ca_cert.der().clone()], key)
        .map_err(io::Error::other)?;
    // The server speaks HTTP/1.1 only; say so, so that no client tries HTTP/2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        config: Arc::new(config),
        ca_pem: ca_cert.pem(),
    })
}

/// A server-side TLS connection over `tcp`; the handshake happens on first use.
pub(crate) fn accept(
    config: &Arc<ServerConfig>,
    tcp: TcpStream,
) -> io::Result<StreamOwned<ServerConnection, TcpStream>> {
    let conn = ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
    Ok(StreamOwned::new(conn, tcp))
}

impl Conn for StreamOwned<ServerConnection, TcpStream> {
    fn end(&mut self, clean: bool) {
        if clean {
            self.conn.send_close_notify();
            let _ = self.flush();
        }
        // Without a close_notify the client sees a truncated stream, as a broken one should be.
        let how = if clean {
            Shutdown::Write
        } else {
            Shutdown::Both
        };
        let _ = self.sock.shutdown(how);
    }
}
