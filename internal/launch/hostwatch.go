package launch

import (
	"fmt"
	"regexp"
	"strings"
)

// mpirun's reports of a host whose daemon could not start or connect (Open MPI 4; 5's PRRTE words the
// first one alike). Each is a banner between dashed lines, naming the host on a later line.
var (
	connectBanner   = regexp.MustCompile(`A process or daemon was unable to complete a TCP connection`)
	interfaceBanner = regexp.MustCompile(`An invalid value was given for (\w+_if_include)`)
	daemonBanner    = regexp.MustCompile(`An ORTE daemon has unexpectedly failed after launch`)
	unstartedBanner = regexp.MustCompile(`(ORTE|PRTE|PRRTE) was unable to reliably start one or more daemons`)
	localHostLine   = regexp.MustCompile(`^\s*Local host:\s*(\S+)`)
	remoteHostLine  = regexp.MustCompile(`^\s*Remote host:\s*(\S+)`)
	valueLine       = regexp.MustCompile(`^\s*Value:\s*(\S+)`)
	remoteDaemon    = regexp.MustCompile(`^\s*Remote daemon:.* on node (\S+)`)
)

// hostWatch reads mpirun's output for a host that could not take part in the job. What it finds counts
// only when mpirun fails: Open MPI also prints some of these banners as warnings of a job that then runs.
type hostWatch struct {
	inBanner            bool   // between a banner's dashed lines
	banner              string // the banner being read: "connect", "interface", "daemon", or ""
	local, remote, what string // its lines so far
	found               []*HostError
	unstarted           bool
	// outside are the last lines outside banners: what a launch agent said before mpirun gave up.
	outside []string
}

func (w *hostWatch) hostLine(line string) {
	if strings.HasPrefix(line, "-----") && strings.Trim(line, "-") == "" {
		if w.inBanner {
			w.endBanner()
		}
		w.inBanner = !w.inBanner
		return
	}
	switch {
	case connectBanner.MatchString(line):
		w.banner = "connect"
	case interfaceBanner.MatchString(line):
		w.banner, w.what = "interface", interfaceBanner.FindStringSubmatch(line)[1]
	case daemonBanner.MatchString(line):
		w.banner = "daemon"
	case unstartedBanner.MatchString(line):
		w.unstarted = true
	case !w.inBanner && !tagged.MatchString(line) && strings.TrimSpace(line) != "":
		w.outside = append(w.outside, strings.TrimSpace(line))
		if len(w.outside) > 3 {
			w.outside = w.outside[1:]
		}
	}
	if m := localHostLine.FindStringSubmatch(line); m != nil {
		w.local = m[1]
	} else if m := remoteHostLine.FindStringSubmatch(line); m != nil {
		w.remote = m[1]
	} else if m := valueLine.FindStringSubmatch(line); m != nil && w.banner == "interface" {
		w.what += " " + m[1]
	} else if m := remoteDaemon.FindStringSubmatch(line); m != nil && w.banner == "daemon" {
		w.local = m[1]
	}
}

// endBanner records the host the banner just read named.
func (w *hostWatch) endBanner() {
	if w.local != "" {
		switch w.banner {
		case "connect":
			w.found = append(w.found, &HostError{Host: w.local, Reason: fmt.Sprintf("mpirun's daemon there could not open a "+
				"TCP connection to %s: the host's link is down, a firewall blocks the connection, or the host has no "+
				"address the others reach (choose the network with --net)", w.remote)})
		case "interface":
			param, value, _ := strings.Cut(w.what, " ")
			w.found = append(w.found, &HostError{Host: w.local, Reason: fmt.Sprintf("has no working interface on the "+
				"network %s given for %s (--net): its link is down, or the network is not the hosts' own", value, param)})
		case "daemon":
			w.found = append(w.found, &HostError{Host: w.local, Reason: "mpirun's daemon there failed after it was " +
				"started and before it reported back"})
		}
	}
	w.banner, w.local, w.remote, w.what = "", "", "", ""
}

// hostFailure is the host problem mpirun reported, if any: the first host it named, else a failure to
// start daemons on hosts it did not name.
func (w *hostWatch) hostFailure() *HostError {
	if len(w.found) > 0 {
		return w.found[0]
	}
	if w.unstarted {
		said := ""
		if len(w.outside) > 0 {
			said = "; before that: " + strings.Join(w.outside, " | ")
		}
		return &HostError{Reason: "mpirun could not start its daemons on every host (\"unable to reliably start one or " +
			"more daemons\": a host is unreachable, refused the launch agent's login, or lacks Open MPI)" + said}
	}
	return nil
}
