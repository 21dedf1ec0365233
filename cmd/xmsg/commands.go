package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/xmsg/xmsg/internal/agy"
	"github.com/xmsg/xmsg/internal/bench"
	"github.com/xmsg/xmsg/internal/config"
	"github.com/xmsg/xmsg/internal/exehelper"
	"github.com/xmsg/xmsg/internal/relaunch"
	"github.com/xmsg/xmsg/internal/version"
)

// stdio is a command's standard streams.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// command is one subcommand. The table below is the one place a subcommand and its flags are
// named: dispatch, `--help`, `xmsg help CMD`, shell completion and the man page all read it,
// so none of them can list a flag the command does not take or miss one it does.
type command struct {
	name    string
	args    string // the positional arguments of the synopsis
	summary string // one line, for `xmsg help`
	about   string // the rest of `xmsg CMD --help`, before the flags
	// flags defines the command's flags on fs and returns its body, which runs with the
	// positional arguments once the flags are parsed.
	flags func(fs *flag.FlagSet, s stdio) func(pos []string) error
	// stop: the flags end at the first positional argument (exec's CMD keeps its own flags).
	// Otherwise flags may come before and after positional arguments; `--` ends them.
	stop bool
	// raw, when set, runs with the arguments unparsed: serve's flags are config's table
	// (which also reads the environment), and flags then only describes them.
	raw func(args []string, s stdio) error
	// help, when set, is the whole `--help` text (serve's comes from config's table).
	help   func(w io.Writer)
	hidden bool // a helper the daemon or bench starts: not in help, completion or the man page
}

// commands is the table. Its order is the order of `xmsg help` and of the man page.
var commands []*command

func init() {
	commands = []*command{
		{name: "serve", summary: "run the bus daemon", flags: serveFlags, help: config.Usage,
			raw: func(args []string, s stdio) error { return serve(args, s.out) }},
		{name: "listen", args: "NAME", summary: "be a session named NAME: print each message as it arrives, reply to it",
			about: listenAbout, flags: listenFlags},
		{name: "reply", args: "MESSAGE_ID TEXT", summary: "reply to a message that an xmsg listen of yours received (TEXT \"-\" reads stdin)",
			about: replyAbout, flags: replyFlags},
		{name: "list", summary: "list live sessions", flags: listFlags},
		{name: "send", args: "REF TEXT", summary: "send a message to a session by id, pid or name (TEXT \"-\" reads stdin)",
			about: sendAbout, flags: sendFlags},
		{name: "replies", args: "MESSAGE_ID", summary: "show the replies to a message, waiting for one with --wait",
			about: repliesAbout, flags: repliesFlags},
		{name: "status", args: "MESSAGE_ID", summary: "show one message's life as the store records it, following it with --wait",
			flags: statusFlags},
		{name: "monitor", summary: "stream the tier's message events live, never their text", about: monitorAbout, flags: monitorFlags},
		{name: "doctor", summary: "show which protections are in force, here and in the running daemon",
			about: doctorAbout, flags: doctorFlags},
		{name: "backup", args: "FILE", summary: "a consistent copy of the running daemon's store, taken while it serves",
			about: backupAbout, flags: backupFlags},
		{name: "health", summary: "exit 0 when the running daemon answers /healthz with 200 (a container probe)",
			flags: healthFlags},
		{name: "mcp", summary: "MCP bridge on stdin/stdout for an agent session", about: mcpAbout, flags: mcpFlags, stop: true},
		{name: "register", args: "agy", summary: "the Antigravity hook helper: register the conversation's credentials",
			about: registerAbout, flags: registerFlags},
		{name: "exec", args: "-- CMD [ARGS...]", summary: "run CMD with a custody secret as a descriptor, never as text",
			about: execAbout, flags: execFlags, stop: true},
		{name: "bench", summary: "measure the bus end to end", about: benchAbout, flags: benchFlags},
		{name: "completion", args: "bash|zsh", summary: "print a shell completion script",
			about: completionAbout, flags: completionFlags},
		{name: "man", summary: "print the manual page (roff): xmsg man | man -l -", flags: manFlags},
		{name: "version", summary: "print the version and the revision it was built from", flags: versionFlags},
		{name: "help", args: "[COMMAND]", summary: "show the commands, or one command's flags", flags: helpFlags},

		// Helpers: the daemon and bench start them with a hidden first argument.
		{name: bench.RoleArg, hidden: true, raw: func(args []string, _ stdio) error { return bench.Role(args) }},
		// The handover helper ends with the status of the last daemon it started.
		{name: relaunch.Arg, hidden: true, raw: func(args []string, _ stdio) error {
			code, err := relaunch.RunHelper(args)
			if err == nil && code != 0 {
				return silentExit(code)
			}
			return err
		}},
		{name: exehelper.Arg, hidden: true, raw: func([]string, stdio) error { return exehelper.Serve() }},
		{name: agy.HelperArg, hidden: true, raw: func(args []string, _ stdio) error {
			if len(args) != 1 {
				return usageError{"agy helper: want the agy program"}
			}
			return agy.ServeHelper(args[0])
		}},
	}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// visible is the table without its hidden helpers.
func visible() []*command {
	var out []*command
	for _, c := range commands {
		if !c.hidden {
			out = append(out, c)
		}
	}
	return out
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	s := stdio{stdin, stdout, stderr}
	if len(args) == 0 {
		writeUsage(stderr)
		return usageError{"no command given; xmsg help lists the commands"}
	}
	name := args[0]
	switch name {
	case "--version", "-version", "-V":
		name = "version"
	case "--help", "-help", "-h":
		name = "help"
	}
	c := lookup(name)
	if c == nil {
		return usageError{fmt.Sprintf("unknown command %s; xmsg help lists the commands", quoteIfOdd(name))}
	}
	return c.run(args[1:], s)
}

// newFlagSet is c's flags, and its body.
func (c *command) newFlagSet(s stdio) (*flag.FlagSet, func([]string) error) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.flags == nil {
		return fs, nil
	}
	return fs, c.flags(fs, s)
}

func (c *command) run(args []string, s stdio) error {
	if c.raw != nil {
		return c.raw(args, s)
	}
	fs, body := c.newFlagSet(s)
	pos, err := parseArgs(fs, args, c.stop)
	if errors.Is(err, flag.ErrHelp) {
		c.writeHelp(s.out)
		return nil
	}
	if err != nil {
		return c.flagError(fs, err)
	}
	return body(pos)
}

// flagError is one line naming the fix: the command's --help, and `--` when the word that
// failed is no flag of the command but could be a text that starts with "-".
func (c *command) flagError(fs *flag.FlagSet, err error) error {
	msg := fmt.Sprintf("%s: %v (xmsg %s --help lists its flags)", c.name, err, c.name)
	if strings.HasPrefix(err.Error(), "flag provided but not defined") && strings.Contains(c.args, "TEXT") {
		msg = fmt.Sprintf("%s: %v; a TEXT that starts with \"-\" goes after --: xmsg %s %s", c.name, err, c.name,
			strings.Replace(c.args, "TEXT", "-- TEXT", 1))
	}
	return usageError{msg}
}

// parseArgs parses flags that may come before or after positional arguments (or, with stop,
// only before them). After `--` every argument is positional.
func parseArgs(fs *flag.FlagSet, args []string, stop bool) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if stop || (len(args) > len(rest) && args[len(args)-len(rest)-1] == "--") {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (c *command) synopsis() string {
	s := "xmsg " + c.name
	if c.hasFlags() {
		s += " [flags]"
	}
	if c.args != "" {
		s += " " + c.args
	}
	return s
}

func (c *command) hasFlags() bool {
	fs, _ := c.newFlagSet(stdio{})
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// flagDoc is one flag as help, completion and the man page show it.
type flagDoc struct {
	name, arg, usage, def string
	boolean               bool
}

func (c *command) flagDocs() []flagDoc {
	fs, _ := c.newFlagSet(stdio{})
	var out []flagDoc
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		bf, ok := f.Value.(interface{ IsBoolFlag() bool })
		switch arg {
		case "string", "value":
			arg = "VALUE"
		case "int", "uint":
			arg = "N"
		default:
			arg = strings.ToUpper(arg)
		}
		d := flagDoc{name: f.Name, arg: arg, usage: usage, def: f.DefValue, boolean: ok && bf.IsBoolFlag()}
		if d.boolean {
			d.arg = ""
		}
		out = append(out, d)
	})
	return out
}

func (d flagDoc) defaultText() string {
	switch {
	case d.def == "" || (d.boolean && d.def == "false"):
		return ""
	case strings.ContainsAny(d.def, " \t"):
		return fmt.Sprintf(" (default %q)", d.def)
	}
	return " (default " + d.def + ")"
}

func (c *command) writeHelp(w io.Writer) {
	if c.help != nil {
		c.help(w)
		return
	}
	fmt.Fprintf(w, "usage: %s\n\n%s.\n", c.synopsis(), upperFirst(c.summary))
	if c.about != "" {
		fmt.Fprintf(w, "\n%s", c.about)
	}
	docs := c.flagDocs()
	if len(docs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	for _, d := range docs {
		head := "--" + d.name
		if d.arg != "" {
			head += " " + d.arg
		}
		fmt.Fprintf(w, "  %-26s %s%s\n", head, d.usage, d.defaultText())
	}
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func writeUsage(w io.Writer) {
	fmt.Fprint(w, "usage: xmsg <command> [flags]\n\ncommands:\n")
	for _, c := range visible() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nxmsg help COMMAND (or xmsg COMMAND --help) lists a command's flags.\n\n"+exitCodesText)
}

const exitCodesText = `exit codes: 0 ok, 1 bus unreachable or failed, 2 usage, 3 refused by the bus (4xx),
4 bus error (5xx), 5 replies --wait: no reply in time
`

func helpFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	return func(pos []string) error {
		switch len(pos) {
		case 0:
			writeUsage(s.out)
			return nil
		case 1:
			c := lookup(pos[0])
			if c == nil || c.hidden {
				return usageError{fmt.Sprintf("help: unknown command %s; xmsg help lists the commands", quoteIfOdd(pos[0]))}
			}
			c.writeHelp(s.out)
			return nil
		}
		return usageError{"help takes one command at most: xmsg help COMMAND"}
	}
}

func versionFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	asJSON := fs.Bool("json", false, "print the build information as JSON")
	return func(pos []string) error {
		if len(pos) > 0 {
			return usageError{"version takes no arguments"}
		}
		if *asJSON {
			return printJSON(s.out, version.Get())
		}
		fmt.Fprintln(s.out, "xmsg", version.String())
		return nil
	}
}

// serveFlags describes serve's flags from config's table (serve parses them there, with the
// environment), for completion and the man page.
func serveFlags(fs *flag.FlagSet, _ stdio) func([]string) error {
	for _, o := range config.Flags() {
		if o.Boolean {
			fs.Bool(o.Name, false, o.Usage+" (env "+o.Env+")")
		} else {
			fs.String(o.Name, o.Default, o.Usage+" (env "+o.Env+")")
		}
	}
	return nil
}

const completionAbout = `Load it in the current shell with
  source <(xmsg completion bash)        # bash
  source <(xmsg completion zsh)         # zsh (after compinit)
or install it where the shell looks for completions (docs/operations.md §1).
`

func completionFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	return func(pos []string) error {
		if len(pos) != 1 {
			return usageError{"usage: xmsg completion bash|zsh"}
		}
		switch pos[0] {
		case "bash":
			writeBashCompletion(s.out)
		case "zsh":
			writeZshCompletion(s.out)
		default:
			return usageError{fmt.Sprintf("completion: unknown shell %s; want bash or zsh", quoteIfOdd(pos[0]))}
		}
		return nil
	}
}

func flagNames(c *command) []string {
	var out []string
	for _, d := range c.flagDocs() {
		out = append(out, "--"+d.name)
	}
	return out
}

func writeBashCompletion(w io.Writer) {
	var names []string
	for _, c := range visible() {
		names = append(names, c.name)
	}
	fmt.Fprintf(w, `# bash completion for xmsg (xmsg completion bash)
_xmsg() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W %q -- "$cur"))
		return
	fi
	local words=""
	case ${COMP_WORDS[1]} in
`, strings.Join(names, " "))
	for _, c := range visible() {
		words := flagNames(c)
		switch c.name {
		case "help":
			words = names
		case "completion":
			words = []string{"bash", "zsh"}
		case "register":
			words = append([]string{"agy"}, words...)
		}
		fmt.Fprintf(w, "\t%s) words=%q ;;\n", c.name, strings.Join(words, " "))
	}
	fmt.Fprint(w, `	esac
	case $cur in
	-*) COMPREPLY=($(compgen -W "$words" -- "$cur")) ;;
	*) COMPREPLY=($(compgen -W "$(echo "$words" | tr ' ' '\n' | grep -v '^-')" -- "$cur")) ;;
	esac
}
complete -o default -F _xmsg xmsg
`)
}

// zshQuote makes s safe inside a single-quoted _arguments spec: no quote, and none of the
// characters that end a description or a value.
func zshQuote(s string) string {
	return strings.NewReplacer("'", "", "[", "(", "]", ")", ":", " ", "\\", "/").Replace(s)
}

func writeZshCompletion(w io.Writer) {
	fmt.Fprint(w, "#compdef xmsg\n# zsh completion for xmsg (xmsg completion zsh)\n_xmsg() {\n\tif (( CURRENT == 2 )); then\n\t\tlocal -a cmds\n\t\tcmds=(\n")
	var names []string
	for _, c := range visible() {
		names = append(names, c.name)
		fmt.Fprintf(w, "\t\t\t'%s:%s'\n", c.name, zshQuote(c.summary))
	}
	fmt.Fprint(w, "\t\t)\n\t\t_describe command cmds\n\t\treturn\n\tfi\n\tlocal -a specs\n\tcase $words[2] in\n")
	for _, c := range visible() {
		var specs []string
		for _, d := range c.flagDocs() {
			spec := fmt.Sprintf("'--%s[%s]", d.name, zshQuote(d.usage))
			if !d.boolean {
				spec += ":" + zshQuote(strings.ToLower(d.arg)) + ":"
			}
			specs = append(specs, spec+"'")
		}
		switch c.name {
		case "help":
			specs = append(specs, "'1:command:("+strings.Join(names, " ")+")'")
		case "completion":
			specs = append(specs, "'1:shell:(bash zsh)'")
		case "register":
			specs = append(specs, "'1:harness:(agy)'")
		}
		specs = append(specs, "'*:file:_files'")
		fmt.Fprintf(w, "\t%s) specs=(%s) ;;\n", c.name, strings.Join(specs, " "))
	}
	fmt.Fprint(w, "\tesac\n\t_arguments -s $specs\n}\nif [ \"$funcstack[1]\" = \"_xmsg\" ]; then\n\t_xmsg \"$@\"\nelse\n\tcompdef _xmsg xmsg\nfi\n")
}

func manFlags(fs *flag.FlagSet, s stdio) func([]string) error {
	return func(pos []string) error {
		if len(pos) > 0 {
			return usageError{"man takes no arguments"}
		}
		writeMan(s.out)
		return nil
	}
}

// roff escapes s for a man page line: backslashes, dashes, a leading dot or quote, and every
// character beyond ASCII as a groff Unicode escape.
func roff(s string) string {
	s = strings.NewReplacer(`\`, `\e`, "-", `\-`).Replace(s)
	if strings.IndexFunc(s, func(r rune) bool { return r > 0x7e }) >= 0 {
		var b strings.Builder
		for _, r := range s {
			if r > 0x7e {
				fmt.Fprintf(&b, `\[u%04X]`, r)
				continue
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

func writeMan(w io.Writer) {
	fmt.Fprintf(w, ".TH XMSG 1 \"\" \"xmsg %s\" \"User Commands\"\n", roff(version.Get().Version))
	fmt.Fprint(w, ".SH NAME\nxmsg \\- per\\-user local message bus for AI agent sessions and services\n")
	fmt.Fprint(w, ".SH SYNOPSIS\n.B xmsg\n.I command\n[flags] [arguments]\n")
	fmt.Fprint(w, ".SH DESCRIPTION\nOne daemon runs per user (trust tier); sessions of that user find each other,\nsend messages and collect replies. Flags may come before or after arguments;\n.B \\-\\-\nends them.\n")
	fmt.Fprint(w, ".SH COMMANDS\n")
	for _, c := range visible() {
		fmt.Fprintf(w, ".SS %s\n%s.\n", roff(c.synopsis()), roff(upperFirst(c.summary)))
		if c.about != "" {
			for _, l := range strings.Split(strings.TrimRight(c.about, "\n"), "\n") {
				if strings.TrimSpace(l) == "" {
					fmt.Fprint(w, ".PP\n")
					continue
				}
				fmt.Fprintln(w, roff(strings.TrimSpace(l)))
			}
		}
		for _, d := range c.flagDocs() {
			head := `\fB\-\-` + roff(d.name) + `\fR`
			if d.arg != "" {
				head += ` \fI` + roff(d.arg) + `\fR`
			}
			fmt.Fprintf(w, ".TP\n%s\n%s\n", head, roff(d.usage+d.defaultText()))
		}
	}
	fmt.Fprint(w, ".SH EXIT STATUS\n")
	for _, l := range strings.Split(strings.TrimSpace(exitCodesText), "\n") {
		fmt.Fprintln(w, roff(l))
	}
	fmt.Fprint(w, ".SH SEE ALSO\nREADME.md and docs/ of the source: operations.md (running it), protocol.md (the wire protocol).\n")
}

// quoteIfOdd shows s as typed when it is plain, and Go-quoted (control and format characters
// escaped) when it holds anything a terminal would interpret or hide (printable's rule), or a
// space or quote that would blur where it ends.
func quoteIfOdd(s string) string {
	if s == "" || printable(s) != s || strings.ContainsAny(s, ` "`) {
		return fmt.Sprintf("%q", s)
	}
	return s
}
