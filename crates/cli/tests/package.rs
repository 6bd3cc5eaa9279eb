//! The Debian package (packaging/, scripts/package): built from the binary under test, its
//! fields and files checked, unpacked into a scratch root with `dpkg-deb -x` (this machine's
//! package database is never touched), its man pages rendered, its binary run and its units
//! verified by systemd-analyze. Another test checks, from the sources, that the shipped
//! configuration file and sluice.toml(5) document every key sluice reads.
mod common;
use common::*;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The keys serde reads into `name` (a struct in `file`): its fields in kebab-case, or
/// their `rename`. Read from the source, so a key added there fails this test until the
/// documentation has it.
fn serde_keys(file: &str, name: &str) -> BTreeSet<String> {
    let text = read(&repo().join(file));
    let start = text.find(&format!("pub struct {name} {{")).unwrap_or_else(|| panic!("no struct {name} in {file}"));
    let body = &text[start..start + text[start..].find("\n}").expect("the struct's end")];
    let mut keys = BTreeSet::new();
    let mut renamed = None;
    for line in body.lines().skip(1).map(str::trim) {
        if let Some(at) = line.find("rename = \"").filter(|_| line.starts_with("#[serde")) {
            let rest = &line[at + "rename = \"".len()..];
            renamed = Some(rest[..rest.find('"').unwrap()].to_owned());
        } else if let Some((field, _)) = line.strip_prefix("pub ").and_then(|l| l.split_once(':')) {
            keys.insert(renamed.take().unwrap_or_else(|| field.replace('_', "-")));
        }
    }
    assert!(!keys.is_empty(), "no fields found in {name} ({file})");
    keys
}

fn table_keys(table: &toml::Table) -> BTreeSet<String> {
    table.keys().cloned().collect()
}

/// packaging/sluice.toml serves nothing as shipped (every line a comment), and with its
/// settings uncommented it is TOML holding every key, each in its place.
#[test]
fn the_configuration_file_documents_every_key_and_sets_none() {
    let text = read(&repo().join("packaging/sluice.toml"));
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        assert!(line.starts_with('#'), "packaging/sluice.toml sets something as shipped: {line:?}");
    }
    // "#key = value", "#[limits]" and "#[[export]]" are settings; "# text" explains.
    let settings: String = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_lowercase() || c == '['))
        .map(|l| format!("{l}\n"))
        .collect();
    let all: toml::Table = settings.parse().unwrap_or_else(|e| panic!("the settings, uncommented, are not TOML: {e}\n{settings}"));
    assert_eq!(table_keys(&all), serde_keys("crates/cli/src/config.rs", "FileConfig"), "top-level keys");
    let limits = all["limits"].as_table().expect("[limits] is a table");
    assert_eq!(table_keys(limits), serde_keys("crates/server/src/limits.rs", "Limits"), "[limits] keys");
    let exports = all["export"].as_array().expect("[[export]] tables");
    let export_keys: BTreeSet<String> = exports.iter().flat_map(|e| table_keys(e.as_table().expect("an [[export]] table"))).collect();
    assert_eq!(export_keys, serde_keys("crates/cli/src/serve_export.rs", "ExportEntry"), "[[export]] keys");
    check_values(&settings);
}

/// Every example value is one sluice takes: `serve --check` passes on the settings with the
/// exports' specs turned into RAM and the keys that name files this machine lacks (TLS
/// files, Ceph access) left out.
fn check_values(settings: &str) {
    let names_a_file = ["tls-certificates", "tls-psk", "rbd-conf", "rbd-id", "rbd-keyring"];
    let checkable: String = settings
        .lines()
        .filter(|l| !names_a_file.iter().any(|key| l.starts_with(&format!("{key} ="))))
        .map(|l| if l.starts_with("spec =") { "spec = \"memory:1M\"\n".to_owned() } else { format!("{l}\n") })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    write_file(&file, checkable.as_bytes());
    let out = output(Command::new(SLUICE).args(["serve", "--check", "--config"]).arg(&file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "serve --check refuses the example values: {stderr}\n{checkable}");
}

/// Every key has an entry (a `.TP` paragraph headed by it) in sluice.toml(5).
#[test]
fn the_manual_page_of_the_configuration_file_has_every_key() {
    let page = read(&repo().join("packaging/sluice.toml.5"));
    let lines: Vec<&str> = page.lines().collect();
    let entries: BTreeSet<String> = lines
        .windows(2)
        .filter(|pair| pair[0] == ".TP")
        .flat_map(|pair| pair[1].replace("\\-", "-").replace(['"', ','], " ").split_whitespace().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let keys = [
        ("crates/cli/src/config.rs", "FileConfig"),
        ("crates/server/src/limits.rs", "Limits"),
        ("crates/cli/src/serve_export.rs", "ExportEntry"),
    ];
    for (file, name) in keys {
        for key in serde_keys(file, name) {
            let documented = match key.as_str() {
                "limits" => page.contains(".B [limits]"),
                "export" => page.contains(".B [[export]]"),
                _ => entries.contains(&key),
            };
            assert!(documented, "sluice.toml(5) has no entry for {key} ({name} in {file})");
        }
    }
}

/// Runs `command`, bounded by `limit` (its whole process group is killed past it);
/// returns (success, stdout, stderr).
fn run_for(command: &mut Command, limit: Duration, scratch: &Path) -> (bool, String, String) {
    use std::os::unix::process::CommandExt;
    let (out, err) = (scratch.join("stdout"), scratch.join("stderr"));
    let mut child = command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let pid = child.id();
    let status = wait_timeout(&mut child, limit);
    if status.is_none() {
        // wait_timeout killed the leader; cargo's children (cargo install) go with the group.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        let _ = child.wait();
    }
    let mut stderr = read(&err);
    if status.is_none() {
        stderr.push_str(&format!("\n[{command:?} was killed: it had not exited after {limit:?}]"));
    }
    (status.is_some_and(|s| s.success()), read(&out), stderr)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// scripts/package with the binary under test; the path of the .deb. None when the test
/// is to be skipped: cargo-deb is missing outside CI (in CI, scripts/package installs it,
/// which takes a minute or two of compiling).
fn build_package(scratch: &Path) -> Option<PathBuf> {
    let installed = output(Command::new(cargo()).args(["deb", "--version"])).status.success();
    if !installed && std::env::var_os("CI").is_none() {
        eprintln!("SKIPPED: cargo-deb is not installed (./scripts/package installs it when run once)");
        return None;
    }
    let limit = Duration::from_secs(if installed { 120 } else { 240 });
    let output = scratch.join("debian");
    let mut package = Command::new(repo().join("scripts/package"));
    package.args(["--fast", "--binary", SLUICE, "--output"]).arg(&output);
    let (ok, stdout, stderr) = run_for(&mut package, limit, scratch);
    assert!(ok, "scripts/package failed:\n{stdout}\n{stderr}");
    let deb = PathBuf::from(stdout.trim_end());
    assert!(deb.starts_with(&output) && deb.is_file(), "scripts/package printed {stdout:?}, not the package it wrote\n{stderr}");
    Some(deb)
}

fn dpkg_deb(args: &[&str]) -> String {
    let (ok, stdout, stderr) = run("dpkg-deb", args);
    assert!(ok, "dpkg-deb {args:?} failed: {stderr}");
    stdout
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

fn check_fields(deb: &Path) {
    let fields = dpkg_deb(&["--field", utf8(deb)]);
    let field = |name: &str| {
        let prefix = format!("{name}: ");
        let line = fields.lines().find(|l| l.starts_with(&prefix));
        line.unwrap_or_else(|| panic!("no {name} field in:\n{fields}"))[prefix.len()..].to_owned()
    };
    assert_eq!(field("Package"), "sluice");
    assert_eq!(field("Version"), format!("{}-1", env!("CARGO_PKG_VERSION")));
    assert!(field("Depends").contains("libc6"), "Depends: {}", field("Depends"));
    assert_eq!(field("Section"), "net");
}

/// The files every installation needs, and the configuration file marked as a conffile.
fn check_contents(deb: &Path, scratch: &Path) {
    let listing = dpkg_deb(&["--contents", utf8(deb)]);
    let files: BTreeSet<&str> = listing.lines().filter_map(|l| l.split_whitespace().last()).collect();
    let man1 = ["sluice", "sluice-serve", "sluice-copy", "sluice-info", "sluice-pool", "sluice-pool-init"];
    let expected = [
        "./usr/bin/sluice",
        "./usr/lib/systemd/system/sluice.service",
        "./usr/lib/systemd/system/sluice.socket",
        "./etc/sluice/sluice.toml",
        "./usr/share/man/man5/sluice.toml.5.gz",
        "./usr/share/bash-completion/completions/sluice",
        "./usr/share/zsh/vendor-completions/_sluice",
    ];
    let pages = man1.iter().map(|p| format!("./usr/share/man/man1/{p}.1.gz"));
    for file in expected.iter().map(|f| f.to_string()).chain(pages) {
        assert!(files.contains(file.as_str()), "the package lacks {file}:\n{listing}");
    }
    assert!(!listing.contains("generate-manual"), "the hidden subcommand has a page:\n{listing}");
    let control = scratch.join("control");
    dpkg_deb(&["--control", utf8(deb), utf8(&control)]);
    assert_eq!(read(&control.join("conffiles")).trim(), "/etc/sluice/sluice.toml");
    // Each maintainer script runs cleanly, with the systemd helpers it calls stubbed out:
    // valid syntax is not enough (a stray word in one once ran as a command).
    let stubs = scratch.join("stubs");
    std::fs::create_dir_all(&stubs).unwrap();
    for helper in ["deb-systemd-helper", "deb-systemd-invoke", "systemctl"] {
        let stub = stubs.join(helper);
        std::fs::write(&stub, "#!/bin/sh\nexit 0\n").unwrap();
        let (ok, _, err) = run("chmod", &["755", utf8(&stub)]);
        assert!(ok, "{err}");
    }
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", stubs.display());
    for (script, action) in [("postinst", "configure"), ("prerm", "remove"), ("postrm", "remove")] {
        let out = output(Command::new("sh").arg(control.join(script)).arg(action).env("PATH", &path));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.trim().is_empty(), "{script} {action}: {}\n{stderr}", out.status);
    }
}

/// `man -l PAGE` as plain text; troff's warnings, if any, in the second string.
fn render(page: &Path) -> (String, String) {
    let out = output(
        Command::new("man")
            .args(["--warnings", "-l"])
            .arg(page)
            .env("LC_ALL", "C")
            .env("MANWIDTH", "100")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat"),
    );
    let (text, warnings) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "man -l {} failed: {warnings}", page.display());
    (text, warnings)
}

fn check_man_pages(root: &Path) {
    let (serve, _) = render(&root.join("usr/share/man/man1/sluice-serve.1.gz"));
    let version = format!("sluice {}", env!("CARGO_PKG_VERSION"));
    for text in ["sluice-serve", "--listen ", "--config ", "SEE ALSO", "sluice.toml(5)", &version] {
        assert!(serve.contains(text), "sluice-serve(1) lacks {text:?}:\n{serve}");
    }
    let (pool_init, _) = render(&root.join("usr/share/man/man1/sluice-pool-init.1.gz"));
    assert!(pool_init.contains("--force") && pool_init.contains("sluice-pool(1)"), "sluice-pool-init(1):\n{pool_init}");
    let (config, warnings) = render(&root.join("usr/share/man/man5/sluice.toml.5.gz"));
    assert!(warnings.is_empty(), "troff warns about sluice.toml(5):\n{warnings}");
    for text in ["SLUICE.TOML(5)", "inflight-requests-per-connection", "[[export]]", "/etc/sluice/sluice.toml", "sluice-serve(1)"] {
        assert!(config.contains(text), "sluice.toml(5) lacks {text:?}:\n{config}");
    }
}

fn check_binary(root: &Path) {
    let sluice = root.join("usr/bin/sluice");
    let (ok, version, stderr) = run(utf8(&sluice), &["--version"]);
    assert!(ok && version.trim() == format!("sluice {}", env!("CARGO_PKG_VERSION")), "--version: {version}{stderr}");
    let (ok, help, stderr) = run(utf8(&sluice), &["serve", "--help"]);
    assert!(ok && help.contains("--config"), "serve --help: {help}{stderr}");
    // As shipped, the configuration is valid and serves nothing.
    let conffile = root.join("etc/sluice/sluice.toml");
    let (ok, said, stderr) = run(utf8(&sluice), &["serve", "--check", "--config", utf8(&conffile)]);
    let said = format!("{said}{stderr}");
    assert!(ok && said.contains("no exports") && said.contains("configuration OK"), "serve --check: {said}");
    // And it serves: a client reads the size of a RAM export through it.
    let (ok, said, stderr) = run(utf8(&sluice), &["serve", "--run", "nbdinfo --size \"$uri\"", "memory:1M"]);
    assert!(ok && said.trim() == "1048576", "the packaged binary did not serve: {said}{stderr}");
}

/// The units as installed, then `systemd-analyze verify` on copies whose ExecStart runs the
/// unpacked binary (verify wants it to exist), with MANPATH at the unpacked man pages so
/// that their Documentation= is checked too.
fn check_units(root: &Path, scratch: &Path) {
    let installed = root.join("usr/lib/systemd/system");
    let service = read(&installed.join("sluice.service"));
    for line in ["Type=notify", "ExecStart=/usr/bin/sluice serve --config /etc/sluice/sluice.toml", "ExecReload=/bin/kill -HUP $MAINPID", "LimitMEMLOCK=infinity"] {
        assert!(service.lines().any(|l| l == line), "sluice.service lacks {line:?}:\n{service}");
    }
    let socket_unit = read(&installed.join("sluice.socket"));
    for address in ["ListenStream=127.0.0.1:10809", "ListenStream=[::1]:10809"] {
        assert!(socket_unit.lines().any(|l| l == address), "sluice.socket lacks {address}");
    }
    let units = scratch.join("units");
    std::fs::create_dir_all(&units).unwrap();
    let binary = root.join("usr/bin/sluice");
    for unit in ["sluice.service", "sluice.socket"] {
        let text = read(&installed.join(unit)).replace("/usr/bin/sluice", utf8(&binary));
        std::fs::write(units.join(unit), text).unwrap();
    }
    let out = output(
        Command::new("systemd-analyze")
            .arg("verify")
            .args([units.join("sluice.service"), units.join("sluice.socket")])
            .env("MANPATH", root.join("usr/share/man")),
    );
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && report.trim().is_empty(), "systemd-analyze verify:\n{report}");
}

#[test]
fn the_package_installs_a_binary_units_configuration_and_manual() {
    require!("dpkg-deb", "dpkg-shlibdeps", "objcopy", "man", "systemd-analyze", "gzip", "nbdinfo");
    let scratch = tempfile::tempdir().unwrap();
    let Some(deb) = build_package(scratch.path()) else { return };
    check_fields(&deb);
    check_contents(&deb, scratch.path());
    let root = scratch.path().join("root");
    dpkg_deb(&["-x", utf8(&deb), utf8(&root)]);
    check_man_pages(&root);
    check_binary(&root);
    check_units(&root, scratch.path());
}
