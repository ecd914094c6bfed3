package sessions

import (
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	// Fields after the command name: state(3) ppid ... flags(9) ... starttime(22).
	stat := func(state, flags string) string {
		return " " + state + " 1 2 3 4 5 " + flags + " 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21\n"
	}
	rest := stat("S", "4194560")
	cases := []struct {
		name, line string
		want       ProcStat
		ok         bool
	}{
		{"plain", "123 (sleep)" + rest, ProcStat{State: 'S', Start: 424242}, true},
		{"spaces and parens in comm", "123 (a) b (c d))" + rest, ProcStat{State: 'S', Start: 424242}, true},
		{"running", "123 (x)" + stat("R", "4194304"), ProcStat{State: 'R', Start: 424242}, true},
		{"zombie", "123 (x)" + stat("Z", "4227084"), ProcStat{State: 'Z', Start: 424242, Exiting: true}, true},
		{"dead", "123 (x)" + stat("X", "4227084"), ProcStat{State: 'X', Start: 424242, Exiting: true}, true},
		{"tearing down (PF_EXITING)", "123 (x)" + stat("D", "4194308"), ProcStat{State: 'D', Start: 424242, Exiting: true}, true},
		{"no comm", "123 sleep S 1 2", ProcStat{}, false},
		{"short", "123 (x) S 1 2 3", ProcStat{}, false},
		{"not a number", "123 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 notanumber", ProcStat{}, false},
		{"flags not a number", "123 (x)" + stat("S", "x"), ProcStat{}, false},
	}
	for _, c := range cases {
		got, err := ParseStat(strings.NewReader(c.line))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v ok=%v", c.name, got, err, c.want, c.ok)
		}
	}
}
