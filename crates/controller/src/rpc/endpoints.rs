//! `EndpointService` (register, renew, unregister, list) and `MintEndpointToken`.
//!
//! Rules beyond the reference's (ARCHITECTURE.md, "Endpoints"): a task registers only for its
//! own job's tasks and a user only for their own jobs; names and addresses are checked; an
//! endpoint is dropped when its attempt ends; capability URLs are minted only for endpoints
//! registered with link access.

use crate::auth::{caller, check_owner};
use crate::error::{Error, Result};
use crate::{lock, Controller};
use iris_proto::cluster::controller as c;
use iris_store::endpoints::{self as store, Endpoint, Registered};
use iris_types::endpoint::{self as ep, Access};
use iris_types::TaskId;
use std::collections::BTreeMap;

use super::now;

/// The lease granted when the registrant asks for none; also the longest granted.
pub(crate) const LEASE_MS: i64 = 10 * 60 * 1000;
/// The shortest lease granted.
pub(crate) const MIN_LEASE_MS: i64 = 3 * 60 * 1000;
/// A capability URL's lifetime when the caller asks for none, and the longest.
const TOKEN_TTL_SECS: i64 = 3600;
const MAX_TOKEN_TTL_SECS: i64 = 7 * 86400;
/// The controller's own services, listed under `/system/`.
pub(crate) const LOG_SERVER: &str = "/system/log-server";

/// A stored endpoint on the wire.
pub(crate) fn to_wire(e: Endpoint) -> c::Endpoint {
    c::Endpoint {
        endpoint_id: Some(e.endpoint_id),
        name: Some(e.name),
        address: Some(e.address),
        task_id: Some(e.task_id),
        metadata: e.metadata.into_iter().collect(),
        access: Some(e.access.code()),
        peer_id: Some(e.peer_id.unwrap_or_default()),
    }
}

fn new_endpoint_id() -> String {
    format!("ep-{}", crate::tick::new_uid())
}

impl Controller {
    pub(crate) async fn register_endpoint(
        &self,
        req: c::RegisterEndpointRequest,
    ) -> Result<c::RegisterEndpointResponse> {
        let task = TaskId::parse(&req.task_id).map_err(|e| {
            Error::invalid(format!(
                "task_id: {e}; a task registers under its own id (IRIS_TASK_ID without the \
                 `:attempt` suffix, e.g. /alice/train/0)"
            ))
        })?;
        ep::check_name(&req.name).map_err(|e| Error::invalid(format!("name: {e}")))?;
        ep::check_address(&req.address).map_err(|e| Error::invalid(format!("address: {e}")))?;
        let access = Access::from_code(req.access).ok_or_else(|| {
            Error::invalid(format!(
                "access: {} is not an access mode; use ENDPOINT_ACCESS_PRIVATE (0) or ENDPOINT_ACCESS_LINK (2)",
                req.access
            ))
        })?;
        let job_id = task.job.to_string();
        check_owner(&caller(), &job_id, "register an endpoint for")?;
        let lease_ms = match &req.lease_duration {
            None => LEASE_MS,
            Some(d) => d.milliseconds.clamp(MIN_LEASE_MS, LEASE_MS),
        };
        let t = now();
        let endpoint = Endpoint {
            endpoint_id: if req.endpoint_id.is_empty() {
                new_endpoint_id()
            } else {
                req.endpoint_id.clone()
            },
            name: req.name.clone(),
            address: req.address.clone(),
            task_id: req.task_id.clone(),
            job_id,
            metadata: req.metadata.into_iter().collect::<BTreeMap<_, _>>(),
            registered_at_ms: t,
            lease_deadline_ms: Some(t + lease_ms),
            access,
            peer_id: None,
        };
        let outcome = {
            let mut conn = self.db();
            let tx = conn.begin()?;
            let r = store::register(&tx, &endpoint, i64::from(req.attempt_id))?;
            tx.commit()?;
            r
        };
        match outcome {
            Registered::Ok => Ok(c::RegisterEndpointResponse {
                endpoint_id: endpoint.endpoint_id,
                lease_duration: Some(iris_proto::time::Duration {
                    milliseconds: lease_ms,
                }),
            }),
            Registered::NoTask => Err(Error::not_found(format!(
                "task_id: task {} not found",
                req.task_id
            ))),
            Registered::Terminal(state) => Err(Error::precondition(format!(
                "task {} is already {state}; endpoint not registered",
                req.task_id
            ))),
            Registered::Stale { current } if current < 0 => Err(Error::precondition(format!(
                "attempt_id: task {} has not started an attempt yet; register from inside the running task",
                req.task_id
            ))),
            Registered::TakenBy(task) => Err(Error::new(
                iris_rpc::Code::AlreadyExists,
                format!(
                    "endpoint_id: {} is registered by task {task}; renew with the id your own registration returned, or leave endpoint_id empty for a new one",
                    endpoint.endpoint_id
                ),
            )),
            Registered::Stale { current } => Err(Error::precondition(format!(
                "attempt_id: attempt {} of task {} is no longer live (the live attempt is {current}, or it has ended); an endpoint belongs to the attempt that serves it",
                req.attempt_id, req.task_id
            ))),
        }
    }

    pub(crate) async fn unregister_endpoint(
        &self,
        req: c::UnregisterEndpointRequest,
    ) -> Result<iris_proto::job::Empty> {
        if req.endpoint_id.is_empty() {
            return Err(Error::invalid(
                "endpoint_id: required; use the id RegisterEndpoint returned",
            ));
        }
        let mut conn = self.db();
        let Some(found) = store::by_id(&*conn, &req.endpoint_id)? else {
            // Unregistering twice is not an error.
            return Ok(iris_proto::job::Empty {});
        };
        if found.peer_id.is_some() {
            return Err(Error::precondition(format!(
                "endpoint {} lives on federation peer {}; its task unregisters it there",
                found.name,
                found.peer_id.unwrap_or_default()
            )));
        }
        check_owner(&caller(), &found.job_id, "unregister an endpoint of")?;
        let tx = conn.begin()?;
        store::unregister(&tx, &req.endpoint_id)?;
        tx.commit()?;
        Ok(iris_proto::job::Empty {})
    }

    pub(crate) async fn list_endpoints(
        &self,
        req: c::ListEndpointsRequest,
    ) -> Result<c::ListEndpointsResponse> {
        if req.prefix.starts_with(ep::SYSTEM_PREFIX) {
            let hit = if req.exact {
                req.prefix == LOG_SERVER
            } else {
                LOG_SERVER.starts_with(&req.prefix)
            };
            let endpoints = hit
                .then(|| c::Endpoint {
                    endpoint_id: Some(LOG_SERVER.into()),
                    name: Some(LOG_SERVER.into()),
                    address: Some(self.url()),
                    ..Default::default()
                })
                .into_iter()
                .collect();
            return Ok(c::ListEndpointsResponse { endpoints });
        }
        for t in &req.task_ids {
            TaskId::parse(t).map_err(|e| Error::invalid(format!("task_ids: '{t}': {e}")))?;
        }
        let conn = lock(&self.endpoint_db);
        let rows = store::list(
            &*conn,
            &store::Filter {
                name: &req.prefix,
                exact: req.exact,
                task_ids: &req.task_ids,
            },
            now(),
        )?;
        Ok(c::ListEndpointsResponse {
            endpoints: rows.into_iter().map(to_wire).collect(),
        })
    }

    pub(crate) async fn mint_endpoint_token(
        &self,
        req: c::MintEndpointTokenRequest,
    ) -> Result<c::MintEndpointTokenResponse> {
        if req.endpoint_name.is_empty() {
            return Err(Error::invalid(
                "endpoint_name: required, e.g. /alice/train/web (see `iris endpoints list`)",
            ));
        }
        let Some(auth) = &self.cfg.auth else {
            return Err(Error::precondition(
                "this controller runs without auth, so /proxy/<name>/ is open to anyone who reaches it and a capability URL adds nothing; configure `auth` to mint them",
            ));
        };
        let endpoint = self.resolve_endpoint(&req.endpoint_name)?.ok_or_else(|| {
            Error::not_found(format!(
                "endpoint_name: no live endpoint '{}' (see `iris endpoints list`)",
                req.endpoint_name
            ))
        })?;
        check_owner(&caller(), &endpoint.job_id, "mint a capability URL for")?;
        if endpoint.access != Access::Link {
            return Err(Error::precondition(format!(
                "endpoint {} is private: capability URLs reach only endpoints registered with access=ENDPOINT_ACCESS_LINK; re-register it with link access, or reach it with your own token at /proxy/{}/",
                endpoint.name,
                ep::encode_proxy_name(&endpoint.name)
            )));
        }
        let ttl = req
            .ttl
            .map(|d| (d.milliseconds / 1000).clamp(1, MAX_TOKEN_TTL_SECS))
            .unwrap_or(TOKEN_TTL_SECS);
        let now_secs = (now() / 1000).max(0) as u64;
        let extra = BTreeMap::from([
            ("scope".to_string(), serde_json::Value::from("proxy")),
            (
                "endpoint".to_string(),
                serde_json::Value::from(endpoint.name.as_str()),
            ),
        ]);
        let token = auth
            .keypair
            .mint(
                &auth.issuer,
                crate::auth::PROXY_AUDIENCE,
                &format!("endpoint:{}", endpoint.name),
                "endpoint",
                ttl as u64,
                now_secs,
                extra,
            )
            .map_err(|e| Error::Internal(format!("minting an endpoint token: {e}")))?;
        let capability_url = format!(
            "{}/proxy/t/{token}/{}",
            self.url().trim_end_matches('/'),
            ep::encode_proxy_name(&endpoint.name)
        );
        Ok(c::MintEndpointTokenResponse {
            token,
            expires_at: Some(iris_proto::time::Timestamp {
                epoch_ms: Some((now_secs as i64 + ttl) * 1000),
            }),
            capability_url,
        })
    }

    /// The live endpoint a name reaches: as written, or in its proxy-URL form (`alice.job.web`).
    pub(crate) fn resolve_endpoint(&self, name: &str) -> Result<Option<Endpoint>> {
        let conn = lock(&self.endpoint_db);
        let t = now();
        if let Some(e) = store::resolve(&*conn, name, t)? {
            return Ok(Some(e));
        }
        for candidate in ep::decode_proxy_name(name) {
            if let Some(e) = store::resolve(&*conn, &candidate, t)? {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }
}

impl Controller {
    /// Drops endpoints whose lease ran out (reads already hide them).
    pub(crate) fn sweep_endpoints(&self) -> crate::error::Result<usize> {
        let mut conn = self.db();
        let tx = conn.begin()?;
        let gone = iris_store::endpoints::sweep_expired(&tx, now())?;
        tx.commit()?;
        for (id, name) in &gone {
            tracing::info!(endpoint = %name, id = %id, "endpoint lease expired");
        }
        Ok(gone.len())
    }
}
