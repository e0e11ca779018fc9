//! Loading the sidecar config: the YAML file, env overrides, validation naming the field at fault, and
//! hot reload.
