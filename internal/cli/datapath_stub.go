package cli

import "github.com/spf13/cobra"

func newAttachCmd() *cobra.Command { return &cobra.Command{Use: "attach"} }
func newDetachCmd() *cobra.Command { return &cobra.Command{Use: "detach"} }
func newStatusCmd() *cobra.Command { return &cobra.Command{Use: "status"} }
