package cli

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

func newOptionsCmd() *cobra.Command {
	var asJSON, markdown bool
	c := &cobra.Command{
		Use:   "options [MODE]",
		Short: "List the options each datapath mode declares: key, flag, type, default, meaning",
		Long: `Every datapath mode declares its options once; attach's flags, the bench's config strings
("flannel/falcon@threshold=85+static=true"), the agent's config file and docs/modes all use
these keys. A key is written with '_' in strings and files and with '-' as a flag.`,
		Example: `  peregrine options                 # every mode
  peregrine options MODE --json     # for machines
  peregrine options MODE --markdown # the table of docs/modes/MODE.md`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			names := datapath.ModeNames()
			if len(args) == 1 {
				if _, err := datapath.Lookup(args[0]); err != nil {
					return err
				}
				names = args
			}
			var schemas []*option.Schema
			for _, n := range names {
				s, err := datapath.Schema(n)
				if err != nil {
					return err
				}
				schemas = append(schemas, s)
			}
			switch {
			case asJSON:
				out := map[string][]option.Spec{}
				for _, s := range schemas {
					out[s.Mode] = append([]option.Spec{}, s.Specs...)
				}
				return printJSON(os.Stdout, out)
			case markdown:
				for _, s := range schemas {
					if len(schemas) > 1 {
						fmt.Printf("### %s\n\n", s.Mode)
					}
					fmt.Print(s.Markdown())
				}
				return nil
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			defer tw.Flush()
			for _, s := range schemas {
				fmt.Fprintf(tw, "%s\n", s.Mode)
				if len(s.Specs) == 0 {
					fmt.Fprintf(tw, "  (no options of its own)\n")
				}
				for _, sp := range s.Specs {
					def := sp.Default
					if def == "" {
						def = "-"
					}
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", sp.Key, sp.Kind, def, sp.Help)
				}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "JSON for machines")
	c.Flags().BoolVar(&markdown, "markdown", false, "markdown tables (docs/modes)")
	c.MarkFlagsMutuallyExclusive("json", "markdown")
	return c
}
