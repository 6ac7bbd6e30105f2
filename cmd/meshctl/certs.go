package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"mesh.dev/internal/identity"
	"mesh.dev/internal/pki"
)

func init() { register(newCertsCmd) }

// Defaults of meshctl certs.
const (
	defaultCertsTrustDomain = "mesh.local"
	defaultCertsValidity    = 8760 * time.Hour
	defaultOperatorName     = "admin"
	defaultBuilderName      = "ci"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make the development CA and the mTLS certificates of services, nodes, operators and builders",
		Long: `certs manages a development certificate authority and the certificates mesh's
mTLS uses. Every certificate carries exactly one SPIFFE URI SAN naming its
identity: spiffe://<trust-domain>/service/<catalog|signer|composer>, or
/node/<name>, /operator/<name>, /builder/<name>. Files are written as
<basename>.pem and <basename>-key.pem (keys mode 0600) next to ca.pem; existing
files are never replaced without --force.`,
	}
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var (
		dir, trustDomain  string
		validity          time.Duration
		noDefaults, force bool
	)
	cmd := &cobra.Command{
		Use:   "init --dir DIR",
		Short: "Create a CA and, unless --no-defaults, certificates for the three services, operator admin and builder ci",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := certsDir(cmd, dir)
			if err != nil {
				return err
			}
			var ids []identity.Identity
			if !noDefaults {
				for _, d := range []struct {
					role identity.Role
					name string
				}{
					{identity.RoleCatalog, ""},
					{identity.RoleSigner, ""},
					{identity.RoleComposer, ""},
					{identity.RoleOperator, defaultOperatorName},
					{identity.RoleBuilder, defaultBuilderName},
				} {
					id, err := identity.New(trustDomain, d.role, d.name)
					if err != nil {
						return fmt.Errorf("--trust-domain: %w", err)
					}
					ids = append(ids, id)
				}
			}
			// Check every file first, so a refusal writes nothing at all
			// rather than a CA without its certificates.
			if !force {
				paths := []string{filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile)}
				for _, id := range ids {
					c, k := pki.Paths(dir, pki.Basename(id))
					paths = append(paths, c, k)
				}
				if err := refuseExisting(paths); err != nil {
					return err
				}
			}
			ca, err := pki.NewCA(trustDomain, validity)
			if err != nil {
				return fmt.Errorf("--trust-domain/--validity: %w", err)
			}
			if err := pki.WriteCA(dir, ca, writeOpts(force)...); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "wrote %s, %s: CA of trust domain %s, valid until %s\n",
				filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile), ca.TrustDomain(),
				ca.Certificate().NotAfter.UTC().Format(time.RFC3339))
			for _, id := range ids {
				if err := issueAndWrite(out, ca, dir, id, pki.IssueOptions{Validity: validity}, force); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory to write into (created mode 0700 if missing; default the --certs-dir of meshctl)")
	f.StringVar(&trustDomain, "trust-domain", defaultCertsTrustDomain, "SPIFFE trust domain of the CA")
	f.DurationVar(&validity, "validity", defaultCertsValidity, "validity of the CA and of the default certificates")
	f.BoolVar(&noDefaults, "no-defaults", false, "write only the CA")
	f.BoolVar(&force, "force", false, "replace existing files, keys included")
	return cmd
}

func newCertsIssueCmd() *cobra.Command {
	var (
		dir, role, name string
		dns, ips        []string
		validity        time.Duration
		noDefaultSANs   bool
		force           bool
	)
	cmd := &cobra.Command{
		Use:   "issue --dir DIR --role ROLE [--name NAME]",
		Short: "Issue a certificate from the CA in --dir",
		Long: `issue signs a certificate for one identity with the CA in --dir (ca.pem,
ca-key.pem) and writes it next to it: <role>.pem for a service, <role>-<name>.pem
otherwise. Services get the SANs localhost, their role name, 127.0.0.1 and ::1;
nodes localhost, 127.0.0.1 and ::1 (their local admin API); --dns and --ip add
more.`,
		Example: `  meshctl certs issue --dir certs --role node --name ace
  meshctl certs issue --dir certs --role composer --dns composer.example.net --ip 10.0.0.7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := certsDir(cmd, dir)
			if err != nil {
				return err
			}
			r := identity.Role(role)
			if !r.Valid() {
				return fmt.Errorf("--role %q: want one of %s", role, rolesList())
			}
			if !r.IsService() && name == "" {
				return fmt.Errorf("--name is required for role %s", r)
			}
			opts := pki.IssueOptions{Validity: validity, DNSNames: dns, NoDefaultSANs: noDefaultSANs}
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return fmt.Errorf("--ip %q is not an IP address", s)
				}
				opts.IPAddresses = append(opts.IPAddresses, ip)
			}
			for _, d := range dns {
				if d == "" || strings.ContainsAny(d, " /:") {
					return fmt.Errorf("--dns %q is not a host name", d)
				}
			}
			ca, err := pki.LoadCA(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile))
			if err != nil {
				return fmt.Errorf("%w (run meshctl certs init first)", err)
			}
			id, err := identity.New(ca.TrustDomain(), r, name)
			if err != nil {
				return fmt.Errorf("--role/--name: %w", err)
			}
			return issueAndWrite(cmd.OutOrStdout(), ca, dir, id, opts, force)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory holding ca.pem and ca-key.pem, written into (default the --certs-dir of meshctl)")
	f.StringVar(&role, "role", "", "role: "+rolesList())
	f.StringVar(&name, "name", "", "name of a node, operator or builder (a DNS label); a service's is its role")
	f.StringSliceVar(&dns, "dns", nil, "extra DNS SANs (repeatable or comma-separated)")
	f.StringSliceVar(&ips, "ip", nil, "extra IP SANs (repeatable or comma-separated)")
	f.DurationVar(&validity, "validity", defaultCertsValidity, "validity; never beyond the CA's")
	f.BoolVar(&noDefaultSANs, "no-default-sans", false, "leave out localhost, the role name and the loopback addresses")
	f.BoolVar(&force, "force", false, "replace an existing certificate and key")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

// certsDir returns --dir, or else the root's --certs-dir when meshctl has
// one, so that certs writes where the other commands read.
func certsDir(cmd *cobra.Command, dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if f := cmd.Flags().Lookup("certs-dir"); f != nil && f.Value.String() != "" {
		return f.Value.String(), nil
	}
	return "", errors.New("--dir is required")
}

func issueAndWrite(out io.Writer, ca *pki.CA, dir string, id identity.Identity, opts pki.IssueOptions, force bool) error {
	base := pki.Basename(id)
	certFile, keyFile := pki.Paths(dir, base)
	if !force {
		if err := refuseExisting([]string{certFile, keyFile}); err != nil {
			return err
		}
	}
	certPEM, keyPEM, err := ca.Issue(id, opts)
	if err != nil {
		return err
	}
	if err := pki.WriteIssued(dir, base, certPEM, keyPEM, writeOpts(force)...); err != nil {
		return err
	}
	dns, ips := opts.DNSNames, opts.IPAddresses
	if !opts.NoDefaultSANs {
		d, i := pki.DefaultSANs(id)
		dns, ips = append(d, dns...), append(i, ips...)
	}
	var sans []string
	if len(dns) > 0 {
		sans = append(sans, "DNS "+strings.Join(dedupe(dns), ", "))
	}
	if len(ips) > 0 {
		var s []string
		for _, ip := range ips {
			s = append(s, ip.String())
		}
		sans = append(sans, "IP "+strings.Join(dedupe(s), ", "))
	}
	extra := ""
	if len(sans) > 0 {
		extra = " (" + strings.Join(sans, "; ") + ")"
	}
	fmt.Fprintf(out, "wrote %s, %s: %s%s\n", certFile, keyFile, id.URI(), extra)
	return nil
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func refuseExisting(paths []string) error {
	for _, p := range paths {
		_, err := os.Lstat(p)
		if err == nil {
			return fmt.Errorf("%s exists; pass --force to replace it", p)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func writeOpts(force bool) []pki.WriteOption {
	if force {
		return []pki.WriteOption{pki.Force()}
	}
	return nil
}

func rolesList() string {
	var s []string
	for _, r := range identity.Roles() {
		s = append(s, string(r))
	}
	return strings.Join(s, ", ")
}
