//! Sluice's end-to-end support: the harness e2e tests call, stand-ins for the cluster's controllers, the
//! whole-system scenarios and the sandbox, run on the in-memory API server (the `sluice-test-apiserver`
//! crate), on a real control plane, or on a real cluster named by `SLUICE_E2E_KUBECONFIG`.
//!
//! # Layout
//!
//! - [`harness`]: what e2e tests call ([`Env`], [`TestNamespace`], [`wait_for`]).
//! - [`control_plane`]: a real etcd, kube-apiserver and kube-controller-manager built from Go modules;
//!   [`pod_network`]: how that API server reaches the processes standing in for Pods.
//! - [`kubelet`], [`deployments`], [`hpa`], [`services`]: stand-ins for the cluster's controllers;
//!   [`podman`]: containers from Sluice's images, for the kubelet stand-in.
//! - [`chart`], [`system`]: the real chart rendered and Sluice installed with it, stand-ins included.
//! - [`scenarios`]: the whole-system scenarios, run on either control plane.
//! - [`sandbox`]: `make sandbox`; [`http`]: a minimal client for scenarios and the sandbox.

pub mod chart;
pub mod control_plane;
pub mod deployments;
pub mod error;
pub mod harness;
pub mod hpa;
pub mod http;
pub mod kubelet;
pub mod pod_network;
pub mod podman;
pub mod sandbox;
pub mod scenarios;
pub mod services;
pub mod system;

pub use error::{ApiError, Error, Result};
pub use harness::{Env, TestNamespace, wait_for};
pub use sluice_test_apiserver::{Options, TestApiServer};
