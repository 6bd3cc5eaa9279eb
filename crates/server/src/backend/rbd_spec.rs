//! How an export names a Ceph RBD image: `rbd:POOL/[NAMESPACE/]IMAGE[@SNAPSHOT]`, and how
//! to reach its cluster (configuration file, client id, keyring). Parsed in every build, so
//! that a build without the `rbd` feature can say what it lacks.

use std::fmt;
use std::path::PathBuf;

/// How to reach and log in to the cluster; unset fields take Ceph's defaults
/// (/etc/ceph/ceph.conf, client.admin, the keyring that configuration names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RbdAccess {
    pub conf: Option<PathBuf>,
    pub id: Option<String>,
    pub keyring: Option<PathBuf>,
}

impl RbdAccess {
    /// These settings, with `defaults` where these have none.
    pub fn or(&self, defaults: &RbdAccess) -> RbdAccess {
        RbdAccess {
            conf: self.conf.clone().or_else(|| defaults.conf.clone()),
            id: self.id.clone().or_else(|| defaults.id.clone()),
            keyring: self.keyring.clone().or_else(|| defaults.keyring.clone()),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == RbdAccess::default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub namespace: Option<String>,
    pub image: String,
    /// A snapshot is served read-only.
    pub snapshot: Option<String>,
    pub access: RbdAccess,
}

impl RbdSpec {
    /// Parses what follows `rbd:`.
    pub fn parse(s: &str) -> Result<RbdSpec, String> {
        let form = "expected rbd:POOL/IMAGE, rbd:POOL/NAMESPACE/IMAGE, or either with @SNAPSHOT";
        let (path, snapshot) = match s.split_once('@') {
            Some((p, snap)) if !snap.is_empty() && !snap.contains(['@', '/']) => (p, Some(snap.to_owned())),
            Some(_) => return Err(format!("rbd:{s}: bad snapshot name ({form})")),
            None => (s, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) || s.contains('\0') {
            return Err(format!("rbd:{s}: {form}"));
        }
        let (pool, namespace, image) = match parts[..] {
            [pool, image] => (pool, None, image),
            [pool, namespace, image] => (pool, Some(namespace.to_owned()), image),
            _ => return Err(format!("rbd:{s}: {form}")),
        };
        Ok(RbdSpec { pool: pool.to_owned(), namespace, image: image.to_owned(), snapshot, access: RbdAccess::default() })
    }
}

/// As written after the export name, without the access settings.
impl fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rbd:{}/", self.pool)?;
        if let Some(ns) = &self.namespace {
            write!(f, "{ns}/")?;
        }
        f.write_str(&self.image)?;
        if let Some(snap) = &self.snapshot {
            write!(f, "@{snap}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_parse_and_display_as_written() {
        let s = RbdSpec::parse("rbd/vm1").unwrap();
        assert_eq!((s.pool.as_str(), s.namespace.as_deref(), s.image.as_str(), s.snapshot.as_deref()), ("rbd", None, "vm1", None));
        let s = RbdSpec::parse("pool/tenant/vm1@before-upgrade").unwrap();
        assert_eq!((s.namespace.as_deref(), s.snapshot.as_deref()), (Some("tenant"), Some("before-upgrade")));
        for text in ["rbd/vm1", "p/ns/i", "p/i@s", "p/ns/i@s"] {
            assert_eq!(RbdSpec::parse(text).unwrap().to_string(), format!("rbd:{text}"));
        }
    }

    #[test]
    fn malformed_names_are_refused_with_the_form() {
        for bad in ["", "rbd", "rbd/", "/img", "a//b", "a/b/c/d", "p/i@", "p/i@a@b", "p/i@x/y", "p/i\0"] {
            let e = RbdSpec::parse(bad).expect_err(bad);
            assert!(e.contains("rbd:POOL/IMAGE"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn access_settings_fall_back_field_by_field() {
        let own = RbdAccess { id: Some("vm".into()), ..RbdAccess::default() };
        let defaults = RbdAccess { conf: Some("/etc/c.conf".into()), id: Some("admin".into()), keyring: None };
        let a = own.or(&defaults);
        assert_eq!((a.conf, a.id.as_deref(), a.keyring), (Some("/etc/c.conf".into()), Some("vm"), None));
        assert!(RbdAccess::default().is_empty() && !own.is_empty());
    }
}
