//! Token vectors minted by the published Python implementation verify here, and our thumbprint
//! equals its `kid` (fixtures made by `fixtures/gen.py` with the published package).

use iris_auth::{public_from_pem, thumbprint, Keypair, Verifier};

const PY_PUBLIC: &str = include_str!("fixtures/python_public.pem");
const PY_PRIVATE: &str = include_str!("fixtures/python_key.pem");
const PY_TOKEN: &str = include_str!("fixtures/python_token.txt");
const PY_KID: &str = include_str!("fixtures/python_kid.txt");

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[test]
fn python_token_verifies_with_our_verifier() {
    let public = public_from_pem(PY_PUBLIC).expect("python public key");
    assert_eq!(thumbprint(&public), PY_KID.trim());
    let mut v = Verifier::new(&["iris", "iris-proxy"]);
    v.trust("compat-cluster", public);
    let c = v
        .verify(PY_TOKEN.trim(), now())
        .expect("python token verifies");
    assert_eq!(c.sub, "alice");
    assert_eq!(c.role, "user");
    assert_eq!(c.iss, "compat-cluster");
}

#[test]
fn python_key_loads_and_gives_the_same_kid() {
    let k = Keypair::from_pem(PY_PRIVATE).expect("python private key loads");
    assert_eq!(k.kid(), PY_KID.trim());
}

#[test]
fn our_private_pem_is_the_form_python_writes() {
    let k = Keypair::from_pem(PY_PRIVATE).expect("python private key loads");
    assert_eq!(k.private_pem().expect("pem").trim(), PY_PRIVATE.trim());
    assert_eq!(k.public_pem().expect("pem").trim(), PY_PUBLIC.trim());
}
