//! `sluice generate-manual DIR`, left out of `--help`: writes the man pages and the shell
//! completions that the Debian package installs (scripts/package). They come from the clap
//! definitions this very binary parses with, so a page cannot say what `--help` does not.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Command;
use clap_complete::Shell;
use clap_mangen::Man;

use crate::exit::EXIT_FAILURE;

#[derive(clap::Args)]
pub struct ManualArgs {
    /// Directory to write into: man pages go to DIR/man (sluice.1, sluice-serve.1, ...),
    /// completions to DIR/completions (sluice.bash for bash, _sluice for zsh).
    dir: PathBuf,
}

/// `cli` is the whole command line of `sluice`, as main.rs defines it.
pub fn run(args: ManualArgs, cli: Command) -> ExitCode {
    match generate(&args.dir, cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice generate-manual: {}: {e}", args.dir.display());
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn generate(dir: &Path, cli: Command) -> io::Result<()> {
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh] {
        clap_complete::generate_to(shell, &mut without_hidden(&cli), "sluice", &completions)?;
    }
    let man = dir.join("man");
    std::fs::create_dir_all(&man)?;
    // `sluice help` is clap's, and says nothing a page would not; building names each
    // subcommand after its parents (sluice-pool-init), which is also its page's name.
    let mut cli = cli.disable_help_subcommand(true);
    cli.build();
    write_pages(&cli, None, &man)
}

/// The page of `cmd` and of every subcommand under it, each ending with a SEE ALSO that
/// links it to its parent and its children.
fn write_pages(cmd: &Command, parent: Option<&str>, dir: &Path) -> io::Result<()> {
    let name = page_name(cmd);
    let mut page = Vec::new();
    // Subcommands carry no version of their own; the footer names the program's.
    let source = format!("sluice {}", env!("CARGO_PKG_VERSION"));
    Man::new(cmd.clone()).manual("sluice manual").source(source).render(&mut page)?;
    page.extend_from_slice(see_also(cmd, parent).as_bytes());
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    for sub in visible_subcommands(cmd) {
        write_pages(sub, Some(name), dir)?;
    }
    Ok(())
}

fn see_also(cmd: &Command, parent: Option<&str>) -> String {
    let mut pages: Vec<String> = parent
        .into_iter()
        .chain(visible_subcommands(cmd).map(page_name))
        .map(|name| format!("\\fB{name}\\fR(1)"))
        .collect();
    // The configuration file is what `sluice serve --config` reads.
    if matches!(page_name(cmd), "sluice" | "sluice-serve") {
        pages.push("\\fBsluice.toml\\fR(5)".to_owned());
    }
    format!(".SH \"SEE ALSO\"\n{}\n", pages.join(",\n"))
}

/// `cli` with its hidden subcommands taken out, which clap_complete would offer (clap has
/// no way to remove a subcommand, so the top level is put together again; completion needs
/// only its name, options and subcommands).
fn without_hidden(cli: &Command) -> Command {
    Command::new("sluice")
        .version(env!("CARGO_PKG_VERSION"))
        .about(cli.get_about().cloned().unwrap_or_default())
        .args(cli.get_arguments().cloned())
        .subcommands(visible_subcommands(cli).cloned())
}

fn visible_subcommands(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|sub| !sub.is_hide_set())
}

/// `sluice`, `sluice-serve`, `sluice-pool-init`: set by `Command::build`.
fn page_name(cmd: &Command) -> &str {
    cmd.get_display_name().unwrap_or(cmd.get_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Command {
        let pool = Command::new("pool").subcommand(Command::new("init")).subcommand(Command::new("status"));
        Command::new("sluice")
            .version(env!("CARGO_PKG_VERSION"))
            .subcommand(Command::new("serve").about("Serve."))
            .subcommand(pool)
            .subcommand(Command::new("generate-manual").hide(true))
    }

    #[test]
    fn one_page_per_visible_command_with_links_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), example()).unwrap();
        let mut pages: Vec<String> = std::fs::read_dir(dir.path().join("man"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        pages.sort();
        assert_eq!(pages, ["sluice-pool-init.1", "sluice-pool-status.1", "sluice-pool.1", "sluice-serve.1", "sluice.1"]);
        let pool = std::fs::read_to_string(dir.path().join("man/sluice-pool.1")).unwrap();
        let see_also = pool.split(".SH \"SEE ALSO\"").nth(1).expect("a SEE ALSO section");
        for link in ["\\fBsluice\\fR(1)", "\\fBsluice-pool-init\\fR(1)", "\\fBsluice-pool-status\\fR(1)"] {
            assert!(see_also.contains(link), "{link} missing from:\n{see_also}");
        }
        let serve = std::fs::read_to_string(dir.path().join("man/sluice-serve.1")).unwrap();
        assert!(serve.contains("\\fBsluice.toml\\fR(5)"), "{serve}");
    }

    #[test]
    fn completions_for_bash_and_zsh() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), example()).unwrap();
        let bash = std::fs::read_to_string(dir.path().join("completions/sluice.bash")).unwrap();
        assert!(bash.contains("serve") && !bash.contains("generate-manual"), "{bash}");
        let zsh = std::fs::read_to_string(dir.path().join("completions/_sluice")).unwrap();
        assert!(zsh.starts_with("#compdef sluice"), "{zsh}");
    }
}
