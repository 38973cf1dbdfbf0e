// expandenv reads a Grafana provisioning file the way Grafana expands it: Go's os.ExpandEnv.
//
// Usage: expandenv FILE
//
// Prints the file, expanded, to stdout. Grafana documents only $VAR and ${VAR}; os.Expand takes
// everything between "${" and "}" as the name, so a shell form such as ${VAR:-default} is the
// (unset) variable "VAR:-default" and expands to nothing. Each ${...} whose name is not a
// variable name is reported on stderr, one line naming the file, and the exit status is 1.
package main

import (
	"fmt"
	"os"
	"regexp"
)

var validName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: expandenv FILE")
		os.Exit(2)
	}
	path := os.Args[1]
	raw, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "expandenv: %v\n", err)
		os.Exit(2)
	}
	status := 0
	expanded := os.Expand(string(raw), func(name string) string {
		if !validName.MatchString(name) {
			fmt.Fprintf(os.Stderr, "expandenv: %s: ${%s} is not a variable Grafana expands (it reads as empty)\n", path, name)
			status = 1
		}
		return os.Getenv(name)
	})
	fmt.Print(expanded)
	os.Exit(status)
}
