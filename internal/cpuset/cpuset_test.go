package cpuset

import (
	"slices"
	"testing"
)

func TestParseFormat(t *testing.T) {
	for in, want := range map[string][]int{"1": {1}, "0-3": {0, 1, 2, 3}, "3,1,1,0-1": {0, 1, 3}, " 0 , 2-3 ": {0, 2, 3}, "8,0-1,5": {0, 1, 5, 8}} {
		got, err := Parse(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, _ := Parse(Format(got)); !slices.Equal(back, want) {
			t.Errorf("Format(%v) = %q does not parse back", got, Format(got))
		}
	}
	for _, bad := range []string{"", "x", "-1", "3-1", "1,", "1-", "0-99999999"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if f := Format([]int{5, 0, 1, 2, 3, 7, 8}); f != "0-3,5,7,8" {
		t.Errorf("Format = %q", f)
	}
}

func TestMask(t *testing.T) {
	cases := map[string][]int{"0": nil, "3": {0, 1}, "80000000": {31}, "1,00000000": {32}, "1,00000001": {0, 32}}
	for want, cpus := range cases {
		if got := Mask(cpus); got != want {
			t.Errorf("Mask(%v) = %q, want %q", cpus, got, want)
		}
		back, err := FromMask(want)
		if err != nil || !slices.Equal(back, cpus) {
			t.Errorf("FromMask(%q) = %v, %v; want %v", want, back, err, cpus)
		}
	}
	if !SameMask("00000003", "3") || SameMask("3", "1") || SameMask("zz", "zz") {
		t.Error("SameMask compares by value")
	}
	if _, err := FromMask("1,zz"); err == nil {
		t.Error("FromMask accepted garbage")
	}
}

func TestOnline(t *testing.T) {
	on, err := Online()
	if err != nil || len(on) == 0 || !slices.IsSorted(on) {
		t.Fatalf("Online() = %v, %v", on, err)
	}
	if err := CheckOnline(on); err != nil {
		t.Error(err)
	}
	if err := CheckOnline([]int{on[len(on)-1] + 4096}); err == nil {
		t.Error("an absent CPU passed CheckOnline")
	}
}
