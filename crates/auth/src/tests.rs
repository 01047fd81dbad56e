use super::*;

const NOW: u64 = 1_800_000_000;

fn verifier_for(k: &Keypair, iss: &str) -> Verifier {
    let mut v = Verifier::new(&["iris", "iris-proxy"]);
    v.trust(iss, k.verifying_key());
    v
}

#[test]
fn round_trip_and_header_shape() {
    let k = Keypair::generate();
    let t = k
        .mint("c1", "iris", "alice", "user", 3600, NOW, BTreeMap::new())
        .expect("mint");
    let header: serde_json::Value =
        serde_json::from_slice(&B64.decode(t.split('.').next().expect("h")).expect("b64"))
            .expect("json");
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["typ"], "JWT");
    assert_eq!(header["kid"], k.kid());
    let c = verifier_for(&k, "c1").verify(&t, NOW + 10).expect("valid");
    assert_eq!(
        (c.sub.as_str(), c.role.as_str(), c.aud.as_str()),
        ("alice", "user", "iris")
    );
}

#[test]
fn refusals() {
    let k = Keypair::generate();
    let other = Keypair::generate();
    let v = verifier_for(&k, "c1");
    let good = k
        .mint("c1", "iris", "alice", "user", 60, NOW, BTreeMap::new())
        .expect("mint");
    assert_eq!(
        v.verify(&good, NOW + 60 + LEEWAY_SECS + 1),
        Err(AuthError::Expired)
    );
    let forged = other
        .mint("c1", "iris", "alice", "admin", 60, NOW, BTreeMap::new())
        .expect("mint");
    assert!(matches!(
        v.verify(&forged, NOW),
        Err(AuthError::BadSignature(_))
    ));
    let unknown = k
        .mint(
            "elsewhere",
            "iris",
            "alice",
            "user",
            60,
            NOW,
            BTreeMap::new(),
        )
        .expect("mint");
    assert!(matches!(
        v.verify(&unknown, NOW),
        Err(AuthError::UnknownIssuer(_))
    ));
    let wrong_aud = k
        .mint(
            "c1",
            "federation",
            "alice",
            "user",
            60,
            NOW,
            BTreeMap::new(),
        )
        .expect("mint");
    assert!(v.verify(&wrong_aud, NOW).is_err());
    // Tampered payload: swap the role.
    let parts: Vec<&str> = good.split('.').collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&B64.decode(parts[1]).expect("b64")).expect("json");
    claims["role"] = "admin".into();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        B64.encode(claims.to_string()),
        parts[2]
    );
    assert!(v.verify(&tampered, NOW).is_err());
    // alg none.
    let none = format!(
        "{}.{}.",
        B64.encode(r#"{"alg":"none","typ":"JWT"}"#),
        parts[1]
    );
    assert!(v.verify(&none, NOW).is_err());
}

#[test]
fn rotation_keeps_old_tokens_valid() {
    let old = Keypair::generate();
    let new = Keypair::generate();
    let t = old
        .mint("c1", "iris", "w", "worker", 600, NOW, BTreeMap::new())
        .expect("mint");
    let mut v = verifier_for(&new, "c1");
    assert!(v.verify(&t, NOW).is_err());
    v.trust("c1", old.verifying_key());
    assert!(v.verify(&t, NOW).is_ok());
}

#[test]
fn pem_round_trip_and_thumbprint_vector() {
    let k = Keypair::generate();
    let again = Keypair::from_pem(&k.private_pem().expect("pem")).expect("load");
    assert_eq!(again.kid(), k.kid());
    let public = public_from_pem(&k.public_pem().expect("pem")).expect("pub");
    assert_eq!(thumbprint(&public), k.kid());
    // RFC 8037 appendix A.3 test vector.
    let x = B64
        .decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
        .expect("b64");
    let vk = VerifyingKey::from_bytes(&x.try_into().expect("32 bytes")).expect("key");
    assert_eq!(
        thumbprint(&vk),
        "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    );
}

#[test]
fn cidrs_and_submitters() {
    assert_eq!(
        cidr_contains("10.0.0.0/8", "10.1.2.3".parse().expect("ip")),
        Ok(true)
    );
    assert_eq!(
        cidr_contains("10.0.0.0/8", "11.1.2.3".parse().expect("ip")),
        Ok(false)
    );
    assert!(cidr_contains("nonsense", "10.1.2.3".parse().expect("ip")).is_err());
    let p = vec!["*@Example.com".to_string(), "bob".to_string()];
    assert!(submitter_allowed(&p, "alice@example.COM"));
    assert!(submitter_allowed(&p, "bob"));
    assert!(!submitter_allowed(&p, "Bob"));
    assert!(!submitter_allowed(&["*".to_string()], "local_admin"));
    assert!(!submitter_allowed(&[], "bob"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
    #[test]
    fn malformed_tokens_never_verify(s in ".{0,300}", dots in 0usize..4) {
        let k = Keypair::generate();
        let v = verifier_for(&k, "c1");
        let mut t = s.clone();
        for _ in 0..dots { t.push('.'); t.push_str(&s); }
        proptest::prop_assert!(v.verify(&t, NOW).is_err());
    }

    #[test]
    fn mutated_tokens_never_verify(pos in 0usize..400, byte in 0u8..=255) {
        let k = Keypair::generate();
        let v = verifier_for(&k, "c1");
        let t = k.mint("c1", "iris", "alice", "user", 600, NOW, BTreeMap::new()).expect("mint");
        let mut b = t.into_bytes();
        let i = pos % b.len();
        proptest::prop_assume!(b[i] != byte);
        b[i] = byte;
        if let Ok(s) = String::from_utf8(b) {
            // A changed byte may still decode to the same base64 bits only in padding positions;
            // anything that verifies must carry exactly the original claims.
            if let Ok(c) = v.verify(&s, NOW) {
                proptest::prop_assert_eq!(c.sub, "alice");
                proptest::prop_assert_eq!(c.role, "user");
            }
        }
    }
}
