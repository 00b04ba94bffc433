//! TLS for the test server: a throwaway CA and a server certificate for 127.0.0.1 and localhost
//! signed by it, written where PostgreSQL reads them (`server.crt`, `server.key` in the data
//! directory) and the CA beside the cluster (`ca.crt`) for clients to trust.

use std::fs;
use std::io;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Makes the CA and the server certificate; `owner` (uid, gid) owns the server's files.
pub(crate) fn write(root: &Path, data: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(io::Error::other)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "stepguard-pgserver test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(io::Error::other)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(io::Error::other)?;
    let ca = Issuer::new(ca_params, ca_key);

    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(io::Error::other)?;
    leaf.distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().map_err(io::Error::other)?;
    let leaf_cert = leaf.signed_by(&leaf_key, &ca).map_err(io::Error::other)?;

    fs::write(root.join("ca.crt"), ca_cert.pem())?;
    let (crt, key) = (data.join("server.crt"), data.join("server.key"));
    fs::write(&crt, leaf_cert.pem())?;
    fs::write(&key, leaf_key.serialize_pem())?;
    crate::owner_only(&key)?;
    if let Some((uid, gid)) = owner {
        for path in [&crt, &key] {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}
