// The jobs list's live update: the rows again every 2 s, each value set as text (never as markup).
(function(){
  const body=document.getElementById('rows'), feed=body.dataset.feed;
  function cell(tr,text,cls){const td=document.createElement('td');if(cls)td.className=cls;td.textContent=text;tr.appendChild(td);return td;}
  function render(rows){
    const fresh=document.createDocumentFragment();
    for(const r of rows){
      const tr=document.createElement('tr');tr.dataset.id=r.id;
      const a=document.createElement('a');a.href=r.href;a.className='mono';a.textContent=r.id.slice(0,12);
      const first=document.createElement('td');first.appendChild(a);tr.appendChild(first);
      cell(tr,r.kind);cell(tr,r.principal);
      const st=cell(tr,'');const b=document.createElement('span');b.className='badge '+r.status;b.textContent=r.status;st.appendChild(b);
      const m=document.createElement('div');m.className='muted';m.textContent=r.message;st.appendChild(m);
      const pr=cell(tr,'');
      if(r.fraction===null){const s=document.createElement('span');s.className='muted';s.textContent=r.done===null?'-':String(r.done);pr.appendChild(s);}
      else{const bar=document.createElement('span');bar.className='bar';const fill=document.createElement('span');fill.style.width=(r.fraction*100).toFixed(1)+'%';bar.appendChild(fill);pr.appendChild(bar);
        const p=document.createElement('span');p.className='pct';p.textContent=Math.round(r.fraction*100)+'%';pr.appendChild(p);}
      cell(tr,r.age);
      const nd=cell(tr,'');const nm=document.createElement('span');nm.className='mono';nm.textContent=r.node;nd.appendChild(nm);
      if(r.heard){const h=document.createElement('div');h.className=r.quiet?'quiet':'muted';h.textContent=r.heard;nd.appendChild(h);}
      cell(tr,String(r.attempts),'num');
      fresh.appendChild(tr);
    }
    body.replaceChildren(fresh);
    document.getElementById('empty').hidden=rows.length>0;
  }
  async function poll(){
    try{const reply=await fetch(feed,{credentials:'same-origin',headers:{'Accept':'application/json'}});
      if(reply.ok){render((await reply.json()).jobs);document.getElementById('live').textContent='live';}
      else{document.getElementById('live').textContent='not updating ('+reply.status+')';}}
    catch(e){document.getElementById('live').textContent='not updating (offline)';}
  }
  setInterval(poll,2000);
})();
