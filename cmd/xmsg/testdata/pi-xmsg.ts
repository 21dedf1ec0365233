// A minimal xmsg extension for pi, as a pi user writes one: the session registers on
// register.sock (harness "pi"), its mail arrives as user messages, and tools send and reply
// through agent.sock, where xmsg attests this process by its registration.
import * as net from "node:net";
import * as path from "node:path";
import { Type } from "@mariozechner/pi-ai";

const dir = path.join(process.env.XDG_RUNTIME_DIR ?? "", "xmsg");

// frame sends one JSON line on a fresh agent.sock connection and returns the answer.
function frame(req: object): Promise<any> {
	return new Promise((resolve, reject) => {
		const c = net.createConnection(path.join(dir, "agent.sock"));
		let buf = "";
		c.on("connect", () => c.write(JSON.stringify(req) + "\n"));
		c.on("data", (d) => {
			buf += d.toString();
			const i = buf.indexOf("\n");
			if (i >= 0) {
				c.end();
				resolve(JSON.parse(buf.slice(0, i)));
			}
		});
		c.on("error", reject);
	});
}

export default function (pi: any) {
	pi.registerTool({
		name: "xmsg_send",
		label: "xmsg send",
		description: "Send a message to another agent session through xmsg.",
		parameters: Type.Object({ ref: Type.String(), text: Type.String() }),
		async execute(_id: string, p: any) {
			const r = await frame({ action: "send", ref: p.ref, text: p.text });
			return { content: [{ type: "text", text: JSON.stringify(r) }], details: {} };
		},
	});
	pi.registerTool({
		name: "xmsg_reply",
		label: "xmsg reply",
		description: "Reply to an xmsg message by its message_id.",
		parameters: Type.Object({ message_id: Type.String(), text: Type.String() }),
		async execute(_id: string, p: any) {
			const r = await frame({ action: "reply", messageId: p.message_id, text: p.text });
			return { content: [{ type: "text", text: JSON.stringify(r) }], details: {} };
		},
	});
	pi.on("session_start", async () => {
		const c = net.createConnection(path.join(dir, "register.sock"));
		let buf = "";
		let registered = false;
		c.on("connect", () => c.write(JSON.stringify({ harness: "pi", sessionName: process.env.XMSG_PI_NAME ?? "pi", cwd: process.cwd() }) + "\n"));
		c.on("data", (d) => {
			buf += d.toString();
			let i;
			while ((i = buf.indexOf("\n")) >= 0) {
				const line = JSON.parse(buf.slice(0, i));
				buf = buf.slice(i + 1);
				if (!registered) {
					registered = line.status === "ok";
				} else if (line.action === "deliver") {
					pi.sendUserMessage(line.envelope, { deliverAs: "followUp" });
					c.write(JSON.stringify({ action: "ack", messageId: line.messageId }) + "\n");
					continue;
				} else if (line.status === "ok") {
					// an ack's answer
				}
				c.write(JSON.stringify({ action: "poll", waitSecs: 30 }) + "\n");
			}
		});
	});
}
