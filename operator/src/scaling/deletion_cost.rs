//! Work-aware scale-in: before replicas go down, idle workers are marked cheaper to delete
//! (`controller.kubernetes.io/pod-deletion-cost`) than busy ones, so the ReplicaSet controller removes
//! idle pods first and running jobs are not cut short. Pure: the caller reads leases and patches pods.

use std::collections::BTreeMap;

/// The pod annotation the ReplicaSet controller reads (lower cost: deleted first).
pub const POD_DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The pod a lease owner runs in. Workers write `<pod name>-<8 hex digits>` (the pod name from
/// `SLUICE_POD_NAME` and a per-process suffix), so the suffix is cut off.
pub fn pod_of_owner(owner: &str) -> &str {
    match owner.rsplit_once('-') {
        Some((pod, suffix)) if suffix.len() == 8 && suffix.chars().all(|c| c.is_ascii_hexdigit()) => pod,
        _ => owner,
    }
}

/// The deletion cost of each pod: the number of jobs it runs (idle pods 0). `leases` are
/// (lease owner, running jobs) pairs; owners that map to no listed pod are ignored.
pub fn deletion_costs(pods: &[String], leases: &[(String, i64)]) -> BTreeMap<String, i32> {
    let mut costs: BTreeMap<String, i32> = pods.iter().map(|p| (p.clone(), 0)).collect();
    for (owner, n) in leases {
        if let Some(c) = costs.get_mut(pod_of_owner(owner)) {
            *c = c.saturating_add(i32::try_from(*n).unwrap_or(i32::MAX));
        }
    }
    costs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_owners_map_to_their_pods() {
        assert_eq!(
            pod_of_owner("emails-worker-7d9f8-abcde-0badcafe"),
            "emails-worker-7d9f8-abcde"
        );
        assert_eq!(pod_of_owner("laptop"), "laptop");
        assert_eq!(
            pod_of_owner("emails-worker-7d9f8-abcde"),
            "emails-worker-7d9f8-abcde"
        );
    }

    #[test]
    fn busy_pods_cost_more_to_delete_than_idle_ones() {
        let pods = vec!["w-a".to_owned(), "w-b".to_owned(), "w-c".to_owned()];
        let leases = vec![
            ("w-b-00000001".to_owned(), 3),
            ("w-b-00000002".to_owned(), 1),
            ("w-c-0000000f".to_owned(), 1),
            ("gone-pod-12345678".to_owned(), 5),
        ];
        let costs = deletion_costs(&pods, &leases);
        assert_eq!(costs["w-a"], 0);
        assert_eq!(costs["w-b"], 4, "two processes in one pod add up");
        assert_eq!(costs["w-c"], 1);
        assert_eq!(costs.len(), 3);
    }
}
