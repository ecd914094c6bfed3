package spec

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"
)

// corpusCase is one declaration of testdata/corpus/cases.json with the verdict it must get.
// The TypeScript SDK's suite (sdk/typescript/test/corpus.test.mjs) runs the same file and
// must give the same verdicts: its validation mirrors this package's.
type corpusCase struct {
	Name     string          `json:"name"`
	Kind     string          `json:"kind"` // "sandbox" or "stack"
	Document json.RawMessage `json:"document"`
	Expect   struct {
		Parse    *string `json:"parse"`
		Problems []struct {
			Path string `json:"path"`
			Rule string `json:"rule"`
		} `json:"problems"`
	} `json:"expect"`
}

func loadCorpus(t *testing.T) []corpusCase {
	t.Helper()
	b, err := os.ReadFile("testdata/corpus/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Cases []corpusCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Cases) == 0 {
		t.Fatal("the corpus is empty")
	}
	return c.Cases
}

// TestCorpus: every declaration of the shared corpus gets the verdict the corpus states.
func TestCorpus(t *testing.T) {
	rulesSeen := map[string]bool{}
	for _, c := range loadCorpus(t) {
		t.Run(c.Name, func(t *testing.T) {
			var fes []*FieldError
			var err error
			switch c.Kind {
			case "sandbox":
				var s *Sandbox
				if s, err = ParseSandbox(c.Document); err == nil {
					fes = s.Validate("")
				}
			case "stack":
				var st *Stack
				if st, err = ParseStack(c.Document); err == nil {
					fes = st.Validate()
				}
			default:
				t.Fatalf("kind %q: want sandbox or stack", c.Kind)
			}
			if c.Expect.Parse != nil {
				var pe *ParseError
				if !errors.As(err, &pe) {
					t.Fatalf("want a parse error at %q, got err %v and problems %v", *c.Expect.Parse, err, fes)
				}
				if pe.Path != *c.Expect.Parse {
					t.Fatalf("parse error at %q (%v), want %q", pe.Path, pe, *c.Expect.Parse)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			var got, want []string
			for _, fe := range fes {
				got = append(got, fe.Path+" "+fe.Rule)
				rulesSeen[fe.Rule] = true
			}
			for _, p := range c.Expect.Problems {
				want = append(want, p.Path+" "+p.Rule)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("problems:\n got  %q\n want %q", got, want)
			}
		})
	}
	// The corpus holds a refusal of every validation rule but the update-only one.
	for _, rule := range []string{
		RuleAPIVersion, RuleKind, RuleSandboxesRequired, RuleIDFormat, RuleIDDuplicate, RuleImageRequired,
		RuleImageOneOf, RuleImageRef, RuleImagePath, RuleImageSnapshot, RuleQuantitySyntax, RuleQuantityPositive,
		RuleQuantityTooLarge, RuleQuantityWholeBytes, RuleQuantityMinimum, RuleCPUMillicores, RuleMaxProcessesPositive,
		RuleEgressMode, RuleEgressDomainsEmpty, RuleEgressDomainsWithoutAllowDomains, RuleDomainSyntax,
		RuleDomainIPLiteral, RuleDomainWildcard, RuleSessionLifetimePositive, RuleSessionIdlePositive,
		RuleSessionIdleExceedsLifetime, RuleLabelKey, RuleLabelValue, RulePreviewPortRange, RulePreviewPortDuplicate,
		RuleEnvName, RuleEnvValue, RuleWorkdirAbsolute, RuleRuntimeUnknown, RuleHostedByUnknown, RuleWorkloadID,
		RuleWorkloadHostsUnknown,
	} {
		if !rulesSeen[rule] {
			t.Errorf("no corpus case is refused by rule %s", rule)
		}
	}
}
