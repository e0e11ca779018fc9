//! Leader election with a `coordination.k8s.io/v1` Lease. kube-runtime 5 has no helper for this
//! (kube-rs/kube#485), so this is the client-go algorithm, small enough to read in one sitting:
//!
//! - a candidate takes the Lease when it is free: absent, released (no holder), or not renewed for
//!   `lease_duration` *as observed locally* — expiry is judged on this replica's monotonic clock from
//!   when it last saw the record change, never by comparing wall clocks across machines;
//! - the holder renews every `renew_every`; if it cannot renew for `renew_deadline` it steps down
//!   before anybody else may take over (`renew_deadline < lease_duration`);
//! - every write is a `replace` carrying the `resourceVersion` read, so two candidates cannot both
//!   win: the loser gets 409 Conflict;
//! - on shutdown the holder releases the Lease, so the next replica takes over at once.
//!
//! Leadership is published on a `watch` channel; only the leader runs controllers, every replica
//! serves the webhook and metrics.

use std::{future::Future, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{sync::watch, time::Instant};
use tracing::{info, warn};

use crate::Result;

/// Default Lease duration (KEDA's numbers: 15 s lease, 10 s renew deadline, 2 s retry).
pub const LEASE_DURATION_DEFAULT: Duration = Duration::from_secs(15);
/// Default renew deadline.
pub const RENEW_DEADLINE_DEFAULT: Duration = Duration::from_secs(10);
/// Default interval between attempts.
pub const RETRY_PERIOD_DEFAULT: Duration = Duration::from_secs(2);

/// Which Lease, who we are, and the timings.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Namespace of the Lease (the operator's).
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a Lease not renewed stays taken.
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// Interval between attempts to take or renew.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Settings with the default timings.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: LEASE_DURATION_DEFAULT,
            renew_deadline: RENEW_DEADLINE_DEFAULT,
            retry_period: RETRY_PERIOD_DEFAULT,
        }
    }
}

/// The elector's memory between attempts.
#[derive(Debug, Default)]
struct Observed {
    /// `(holder, renewTime, resourceVersion)` of the record last seen, and when it was first seen.
    record: Option<(String, Option<MicroTime>, String)>,
    seen_at: Option<Instant>,
    /// When this replica last renewed successfully.
    renewed_at: Option<Instant>,
}

/// Take part in the election until `shutdown`, publishing leadership on `leading`.
pub async fn run(
    client: Client,
    settings: LeaseSettings,
    leading: watch::Sender<bool>,
    shutdown: impl Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut observed = Observed::default();
    tokio::pin!(shutdown);
    loop {
        let holds = match attempt(&api, &settings, &mut observed).await {
            Ok(holds) => holds,
            Err(e) => {
                warn!(error = %e, lease = %settings.name, "leader election attempt failed");
                // Keep leading only while the last renewal is recent enough.
                observed
                    .renewed_at
                    .is_some_and(|t| t.elapsed() < settings.renew_deadline)
                    && *leading.borrow()
            }
        };
        if holds != *leading.borrow() {
            info!(identity = %settings.identity, leading = holds, "leadership changed");
            leading.send_replace(holds);
        }
        tokio::select! {
            () = tokio::time::sleep(settings.retry_period) => {}
            () = &mut shutdown => break,
        }
    }
    if *leading.borrow() {
        leading.send_replace(false);
        if let Err(e) = release(&api, &settings).await {
            warn!(error = %e, "could not release the Lease; the next leader waits for it to expire");
        }
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX).max(1)
}

/// One try to take or renew the Lease. Returns whether this replica holds it afterwards.
async fn attempt(api: &Api<Lease>, s: &LeaseSettings, observed: &mut Observed) -> Result<bool> {
    let Some(lease) = api.get_opt(&s.name).await? else {
        let fresh = Lease {
            metadata: ObjectMeta {
                name: Some(s.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(s.identity.clone()),
                lease_duration_seconds: Some(seconds(s.lease_duration)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &fresh).await {
            Ok(_) => {
                observed.renewed_at = Some(Instant::now());
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let rv = lease.metadata.resource_version.clone().unwrap_or_default();
    let record = (holder.clone(), spec.renew_time.clone(), rv);
    if observed.record.as_ref() != Some(&record) {
        observed.record = Some(record);
        observed.seen_at = Some(Instant::now());
    }
    let duration = spec
        .lease_duration_seconds
        .map(|d| Duration::from_secs(u64::try_from(d).unwrap_or(0)))
        .unwrap_or(s.lease_duration);
    let ours = holder == s.identity;
    let free = holder.is_empty() || observed.seen_at.is_some_and(|t| t.elapsed() >= duration);
    if !ours && !free {
        return Ok(false);
    }
    let mut next = lease.clone();
    let transitions = spec.lease_transitions.unwrap_or(0);
    next.spec = Some(LeaseSpec {
        holder_identity: Some(s.identity.clone()),
        lease_duration_seconds: Some(seconds(s.lease_duration)),
        acquire_time: if ours {
            spec.acquire_time.clone()
        } else {
            Some(now())
        },
        renew_time: Some(now()),
        lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
        ..spec
    });
    match api.replace(&s.name, &PostParams::default(), &next).await {
        Ok(_) => {
            observed.renewed_at = Some(Instant::now());
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Give the Lease up, so another replica need not wait for it to expire.
async fn release(api: &Api<Lease>, s: &LeaseSettings) -> Result<()> {
    let Some(mut lease) = api.get_opt(&s.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(&s.identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    api.replace(&s.name, &PostParams::default(), &lease).await?;
    Ok(())
}
