// promrules checks Prometheus rule files as `promtool check rules` does, with Prometheus's own code
// (model/rulefmt: strict YAML, unique group names, every expr parsed by the PromQL parser, `for` and
// label/annotation templates checked), and with one rule of ichord's: every alert has a `for:`.
// Usage: promrules FILE... ; exit 0 when every file passes, 1 with one line per problem otherwise.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	failed := false
	for _, path := range os.Args[1:] {
		groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.Default())
		for _, err := range errs {
			fmt.Printf("%s: %v\n", path, err)
			failed = true
		}
		if groups == nil {
			continue
		}
		alerts := 0
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				alerts++
				if r.For == 0 {
					fmt.Printf("%s: group %q, alert %q: no for: clause\n", path, g.Name, r.Alert)
					failed = true
				}
			}
		}
		fmt.Printf("%s: %d group(s), %d alert(s)\n", path, len(groups.Groups), alerts)
	}
	if failed || len(os.Args) < 2 {
		os.Exit(1)
	}
}
