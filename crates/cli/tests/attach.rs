//! `sluice attach` and `sluice detach` on this host, which has no nbd driver: the command
//! line, the errors a user meets, and `--list`. The kernel side runs in a guest
//! (kernel_client.rs, `attach_rides_through_server_restarts`).
mod common;
use common::*;

use std::process::Command;

fn sluice(args: &[&str], attach_dir: &std::path::Path) -> (Option<i32>, String, String) {
    let out = output(Command::new(SLUICE).args(args).env("SLUICE_ATTACH_DIR", attach_dir));
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn help_names_every_option_the_issue_fixes() {
    let dir = tempfile::tempdir().unwrap();
    let (code, help, _) = sluice(&["attach", "--help"], dir.path());
    assert_eq!(code, Some(0));
    for opt in ["--connections", "--timeout", "--dead-timeout", "--read-only", "--foreground", "--pid-file", "--list", "--tls-certificates"] {
        assert!(help.contains(opt), "attach --help lacks {opt}:\n{help}");
    }
    let (code, help, _) = sluice(&["detach", "--help"], dir.path());
    assert_eq!(code, Some(0));
    assert!(help.contains("DEVICE"), "{help}");
}

#[test]
fn a_device_that_is_not_nbd_or_a_bad_uri_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = sluice(&["detach", "/dev/sda"], dir.path());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is not an nbd device"), "{err}");
    let (code, _, err) = sluice(&["attach", "nbd://localhost/x", "/dev/loop0"], dir.path());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is not an nbd device"), "{err}");
    let (code, _, err) = sluice(&["attach", "http://localhost/x"], dir.path());
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = sluice(&["attach", "--connections", "0", "nbd://localhost/x"], dir.path());
    assert_eq!(code, Some(2), "{err}");
}

/// Without the driver, attach says how to get it, in the foreground and from the
/// background parent alike (which passes on the guardian's status), and leaves nothing
/// behind.
#[test]
fn without_the_nbd_driver_attach_says_to_load_it() {
    if std::path::Path::new("/sys/module/nbd").exists() {
        eprintln!("SKIP: this kernel has nbd loaded; the guest tests cover attaching");
        return;
    }
    let server = Sluice::start(&["--export", "disk=memory:4M"]);
    let uri = format!("nbd+unix:///disk?socket={}", server.socket.display());
    let dir = tempfile::tempdir().unwrap();
    for mode in [&["--foreground"][..], &[]] {
        let mut args = vec!["attach"];
        args.extend(mode);
        args.push(&uri);
        let (code, out, err) = sluice(&args, dir.path());
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("no nbd driver") && err.contains("modprobe nbd"), "{args:?}: {err}");
        assert_eq!(out, "", "{args:?} printed a device");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a state file was left");
}

#[test]
fn list_shows_each_guarded_device_and_a_guardian_that_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, _) = sluice(&["attach", "--list"], dir.path());
    assert_eq!(code, Some(0));
    assert_eq!(out.lines().count(), 1, "only the header for no devices: {out}");
    // What a guardian writes, once with this test's own pid (alive) and once with a pid
    // that cannot be alive.
    let me = std::process::id();
    std::fs::write(dir.path().join("nbd2"), format!("device=/dev/nbd2\nuri=nbd://a:10809/x\npid={me}\nstate=connected\nreconnects=3\nconnections=4\n")).unwrap();
    std::fs::write(dir.path().join("nbd7"), "device=/dev/nbd7\nuri=nbd://b:10809/y\npid=4194304\nstate=reconnecting\nreconnects=0\nconnections=1\n").unwrap();
    let (code, out, _) = sluice(&["attach", "--list"], dir.path());
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[1].starts_with("/dev/nbd2") && lines[1].contains(" 3 ") && lines[1].contains("nbd://a:10809/x (connected)"), "{out}");
    assert!(lines[2].starts_with("/dev/nbd7") && lines[2].contains("guardian gone (reconnecting)"), "{out}");

    // A reader gone before the listing (`| head -0`) ends it quietly, not with a panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let stderr = dir.path().join("stderr");
    let mut child = Command::new(SLUICE)
        .args(["attach", "--list"])
        .env("SLUICE_ATTACH_DIR", dir.path())
        .stdout(writer)
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, std::time::Duration::from_secs(10));
    let _ = child.kill();
    let err = std::fs::read_to_string(&stderr).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
