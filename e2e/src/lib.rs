//! Sluice's end-to-end support: an in-memory Kubernetes API server that kube-runtime and real `kubectl`
//! accept, and a harness that runs e2e tests against it — or against a real cluster named by
//! `SLUICE_E2E_KUBECONFIG`.
//!
//! # Layout
//!
//! - [`server`]: [`TestApiServer`] — listener, TLS, auth, in-process handle.
//! - [`api`]: routing and the resource verbs; [`watch`], [`discovery`], [`openapi`], [`table`], [`scale`].
//! - [`store`]: objects, the resourceVersion counter, change history, finalizers, garbage collection.
//! - [`registry`], [`builtins`], [`crd`]: the types served.
//! - [`merge`], [`shape`], [`fieldset`]: strategic merge patch and server-side apply with managedFields.
//! - [`validation`]: CRD schema checks, pruning, defaults and CEL rules.
//! - [`admission`]: mutating webhooks; [`aggregator`]: APIService proxying.
//! - [`tls`], [`kubeconfig`]: certificates and the kubeconfig clients use.
//! - [`harness`]: what e2e tests call.
//! - [`control_plane`]: a real etcd, kube-apiserver and kube-controller-manager built from Go modules;
//!   [`pod_network`]: how that API server reaches the processes standing in for Pods.
//! - [`kubelet`], [`deployments`], [`hpa`], [`services`]: stand-ins for the cluster's controllers;
//!   [`podman`]: containers from Sluice's images, for the kubelet stand-in.
//! - [`chart`], [`system`]: the real chart rendered and Sluice installed with it, stand-ins included.
//! - [`scenarios`]: the whole-system scenarios, run on either control plane.
//! - [`sandbox`]: `make sandbox`; [`http`]: a minimal client for scenarios and the sandbox.

pub mod admission;
pub mod aggregator;
pub mod api;
pub mod builtins;
pub mod chart;
pub mod control_plane;
pub mod crd;
pub mod deployments;
pub mod discovery;
pub mod error;
pub mod fieldset;
pub mod harness;
pub mod hpa;
pub mod http;
pub mod kubeconfig;
pub mod kubelet;
pub mod merge;
pub mod openapi;
pub mod pod_network;
pub mod podman;
pub mod protobuf;
pub mod registry;
pub mod sandbox;
pub mod scale;
pub mod scenarios;
pub mod selectors;
pub mod server;
pub mod services;
pub mod shape;
pub mod store;
pub mod system;
pub mod table;
pub mod tls;
pub mod validation;
pub mod watch;

pub use error::{ApiError, Error, Result};
pub use harness::{Env, TestNamespace, wait_for};
pub use server::{Options, TestApiServer};
