//! Firewall names shared with the Go plugins.
