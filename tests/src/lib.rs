//! Shared helpers for the black-box tests.
