//! Identity-aware proxy assertions (reference federation-k8s §2.1): behind Google IAP every
//! request carries `x-goog-iap-jwt-assertion`, an ES256 JWT signed by Google for a configured
//! audience. This layer verifies it against configured P-256 public keys (a JWKS document) and
//! yields the user's email. It is pluggable: the controller consults it only when `auth.iap` is
//! configured, after bearer tokens and before trusted peers.

use crate::AuthError;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::collections::BTreeMap;

/// The header IAP adds to each request it lets through.
pub const HEADER: &str = "x-goog-iap-jwt-assertion";
/// The issuer of IAP assertions.
pub const ISSUER: &str = "https://cloud.google.com/iap";

/// Verifies IAP assertions for one audience.
#[derive(Clone)]
pub struct IapVerifier {
    audience: String,
    keys: BTreeMap<String, DecodingKey>,
}

impl std::fmt::Debug for IapVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IapVerifier")
            .field("audience", &self.audience)
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Who IAP says is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IapIdentity {
    pub email: String,
    pub sub: String,
}

#[derive(serde::Deserialize)]
struct IapClaims {
    #[serde(default)]
    email: String,
    #[serde(default)]
    sub: String,
}

impl IapVerifier {
    /// `jwks`: a JWKS document of EC P-256 keys (`kty: EC`, `crv: P-256`, `kid`, `x`, `y`), as
    /// Google publishes at `https://www.gstatic.com/iap/verify/public_key-jwk`.
    pub fn from_jwks(audience: &str, jwks: &str) -> Result<IapVerifier, AuthError> {
        if audience.trim().is_empty() {
            return Err(AuthError::BadKey(
                "auth.iap.signed_header_audience is required (e.g. /projects/N/global/backendServices/M)".into(),
            ));
        }
        let doc: serde_json::Value = serde_json::from_str(jwks)
            .map_err(|e| AuthError::BadKey(format!("IAP keys are not a JWKS document: {e}")))?;
        let mut keys = BTreeMap::new();
        for (i, k) in doc["keys"].as_array().into_iter().flatten().enumerate() {
            let field = |name: &str| {
                k[name]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| AuthError::BadKey(format!("IAP key {i}: `{name}` is missing")))
            };
            if field("kty")? != "EC" || field("crv")? != "P-256" {
                return Err(AuthError::BadKey(format!(
                    "IAP key {i}: only EC P-256 keys (ES256) are accepted"
                )));
            }
            let key = DecodingKey::from_ec_components(&field("x")?, &field("y")?)
                .map_err(|e| AuthError::BadKey(format!("IAP key {i}: {e}")))?;
            keys.insert(field("kid")?, key);
        }
        if keys.is_empty() {
            return Err(AuthError::BadKey(
                "the IAP JWKS document has no keys".into(),
            ));
        }
        Ok(IapVerifier {
            audience: audience.to_string(),
            keys,
        })
    }

    /// Verifies an assertion: ES256 only, a known `kid`, issuer IAP, our audience, `exp`/`iat`
    /// required with 60 s leeway, and an email.
    pub fn verify(&self, token: &str, now_secs: u64) -> Result<IapIdentity, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| AuthError::BadToken(format!("IAP assertion: {e}")))?;
        if header.alg != Algorithm::ES256 {
            return Err(AuthError::BadToken(format!(
                "IAP assertion: algorithm {:?} is not ES256",
                header.alg
            )));
        }
        let kid = header
            .kid
            .ok_or_else(|| AuthError::BadToken("IAP assertion has no kid".into()))?;
        let key = self
            .keys
            .get(&kid)
            .ok_or_else(|| AuthError::BadSignature(format!("IAP key {kid}")))?;
        let mut v = Validation::new(Algorithm::ES256);
        v.set_audience(&[&self.audience]);
        v.set_issuer(&[ISSUER]);
        v.set_required_spec_claims(&["exp", "iat", "aud", "iss"]);
        v.leeway = 60;
        v.validate_exp = false; // checked below against the caller's clock
        let data = jsonwebtoken::decode::<serde_json::Value>(token, key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::InvalidAudience => AuthError::BadAudience,
                ErrorKind::InvalidSignature => AuthError::BadSignature(ISSUER.into()),
                ErrorKind::InvalidIssuer => AuthError::UnknownIssuer("IAP assertion".into()),
                _ => AuthError::BadToken(format!("IAP assertion: {e}")),
            }
        })?;
        let exp = data.claims["exp"].as_u64().unwrap_or(0);
        if exp + 60 < now_secs {
            return Err(AuthError::Expired);
        }
        let iat = data.claims["iat"].as_u64().unwrap_or(u64::MAX);
        if iat > now_secs + 60 {
            return Err(AuthError::BadToken(
                "IAP assertion issued in the future".into(),
            ));
        }
        let c: IapClaims = serde_json::from_value(data.claims)
            .map_err(|e| AuthError::BadToken(format!("IAP assertion claims: {e}")))?;
        if c.email.trim().is_empty() {
            return Err(AuthError::BadToken("IAP assertion carries no email".into()));
        }
        // IAP prefixes identities with their namespace (`accounts.google.com:`).
        let email = c
            .email
            .rsplit_once(':')
            .map(|(_, e)| e.to_string())
            .unwrap_or(c.email);
        Ok(IapIdentity { email, sub: c.sub })
    }
}

#[cfg(test)]
pub(crate) mod testkey {
    //! A locally generated P-256 key standing in for Google's, for tests.
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

    pub struct TestIapKey {
        pub pkcs8: Vec<u8>,
        pub kid: String,
        pub x: String,
        pub y: String,
    }

    impl TestIapKey {
        pub fn generate(kid: &str) -> TestIapKey {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .expect("generate");
            let kp =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .expect("parse");
            let pt = kp.public_key().as_ref();
            TestIapKey {
                pkcs8: pkcs8.as_ref().to_vec(),
                kid: kid.into(),
                x: B64.encode(&pt[1..33]),
                y: B64.encode(&pt[33..65]),
            }
        }

        pub fn jwks(&self) -> String {
            serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": self.kid, "x": self.x, "y": self.y}]}).to_string()
        }

        pub fn sign(&self, claims: &serde_json::Value) -> String {
            let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
            h.kid = Some(self.kid.clone());
            jsonwebtoken::encode(
                &h,
                claims,
                &jsonwebtoken::EncodingKey::from_ec_der(&self.pkcs8),
            )
            .expect("sign")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testkey::TestIapKey;
    use super::*;

    const AUD: &str = "/projects/1/global/backendServices/2";

    fn claims(aud: &str, iat: u64, exp: u64) -> serde_json::Value {
        serde_json::json!({"iss": ISSUER, "aud": aud, "iat": iat, "exp": exp,
            "email": "accounts.google.com:alice@example.com", "sub": "accounts.google.com:123"})
    }

    #[test]
    fn verifies_and_refuses() {
        let k = TestIapKey::generate("k1");
        let v = IapVerifier::from_jwks(AUD, &k.jwks()).expect("verifier");
        let now = 1_800_000_000;
        let id = v
            .verify(&k.sign(&claims(AUD, now, now + 600)), now)
            .expect("valid");
        assert_eq!(id.email, "alice@example.com");
        assert!(matches!(
            v.verify(&k.sign(&claims("other", now, now + 600)), now),
            Err(AuthError::BadAudience)
        ));
        assert!(matches!(
            v.verify(&k.sign(&claims(AUD, now - 7200, now - 3600)), now),
            Err(AuthError::Expired)
        ));
        let stranger = TestIapKey::generate("k1");
        assert!(v
            .verify(&stranger.sign(&claims(AUD, now, now + 600)), now)
            .is_err());
        let unknown_kid = TestIapKey::generate("k2");
        assert!(v
            .verify(&unknown_kid.sign(&claims(AUD, now, now + 600)), now)
            .is_err());
        // alg none and garbage.
        let none = format!(
            "{}.{}.",
            base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                br#"{"alg":"none","kid":"k1"}"#
            ),
            base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                claims(AUD, now, now + 600).to_string()
            )
        );
        assert!(v.verify(&none, now).is_err());
        assert!(v.verify("not.a.jwt", now).is_err());
        assert!(IapVerifier::from_jwks("", &k.jwks()).is_err());
        assert!(IapVerifier::from_jwks(AUD, "{}").is_err());
    }
}
