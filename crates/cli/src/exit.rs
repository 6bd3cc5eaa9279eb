//! The exit statuses every subcommand shares (README.md, "Exit status"). They sit apart
//! from main.rs so that subcommands depend on them without depending on the dispatcher.

/// Exit status when the server could not start or failed while running, or a client
/// subcommand failed (unreachable server, unknown export, I/O error).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for a bad command line, configuration or URI (clap also uses 2).
pub const EXIT_USAGE: u8 = 2;
/// Exit status when the reader of our output went away (`sluice info | head`): what a
/// shell reports for a program SIGPIPE killed.
pub const EXIT_STDOUT_CLOSED: i32 = 128 + libc::SIGPIPE;
