package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
)

// relayImpostor is the test binary in a role: it listens on the socket path in its last
// argument as whatever uid it was started as, prints "ready", and answers every line ok,
// taking whatever text it is sent: a socket another uid planted where replies are relayed.
func relayImpostor() int {
	l, err := net.Listen("unix", os.Args[len(os.Args)-1])
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	fmt.Println("ready")
	for {
		c, err := l.Accept()
		if err != nil {
			return 0
		}
		go func() {
			defer c.Close()
			if _, err := bufio.NewReader(c).ReadBytes('\n'); err == nil {
				c.Write([]byte(`{"status":"ok","messageId":"stolen"}` + "\n"))
			}
		}()
	}
}
